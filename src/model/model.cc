// Model::load: config.json -> ModelConfig (family dispatch), weights -> DecoderModel.
#include "model/model.h"

#include "model/config.h"
#include "model/decoder.h"
#include "model/gguf_model.h"
#include "model/weights.h"

namespace turbokv {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (is_gguf_file(dir)) {
    auto file = std::make_shared<const GgufFile>(GgufFile::open(dir));
    ModelConfig config = gguf_model_config(*file);
    GgufTensorMap map = gguf_tensor_map(*file, config);
    return std::make_unique<DecoderModel>(std::move(config),
                                          WeightStore::open_gguf(std::move(file), std::move(map)));
  }
  ModelConfig config = load_model_config(dir);
  return std::make_unique<DecoderModel>(std::move(config), WeightStore::open(dir));
}

}  // namespace turbokv
