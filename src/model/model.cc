// Model::load: config.json -> ModelConfig (family dispatch), weights -> DecoderModel.
#include "model/model.h"

#include "model/config.h"
#include "model/decoder.h"
#include "model/weights.h"

namespace turbokv {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  ModelConfig config = load_model_config(dir);
  return std::make_unique<DecoderModel>(std::move(config), WeightStore::open(dir));
}

}  // namespace turbokv
