// Slot file names: only plain names inside the slot directory are accepted; every way out of it
// (.., /, absolute paths, hidden names, symbolic links) is a 400 naming 'filename'.
#include "server/slots.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "server/openai.h"

namespace turbokv::server {
namespace {

void expect_refused(const std::string& dir, const std::string& name) {
  try {
    slot_file_path(dir, name);
    ADD_FAILURE() << "accepted '" << name << "'";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << name;
    EXPECT_EQ(e.param.value_or(""), "filename") << name;
  }
}

TEST(SlotFiles, PlainNamesStayInTheDirectory) {
  const std::string dir = ::testing::TempDir() + "/slots";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(slot_file_path(dir, "chat-1.tkv"), dir + "/chat-1.tkv");
  EXPECT_EQ(slot_file_path(dir, "a"), dir + "/a");
  EXPECT_EQ(slot_file_path(dir, "Session_2024.bin"), dir + "/Session_2024.bin");
  for (const std::string& name : std::vector<std::string>{
           "", "..", ".", "../x", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", ".hidden",
           "x y", "a:b", std::string("a\0b", 3), std::string(129, 'a'), "..%2fx", "~root"}) {
    expect_refused(dir, name);
  }
  std::filesystem::remove(dir + "/link");
  std::filesystem::create_symlink("/etc/passwd", dir + "/link");
  expect_refused(dir, "link");
}

}  // namespace
}  // namespace turbokv::server
