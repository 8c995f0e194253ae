#include "common/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "tests/common/temp_dir.h"

namespace meshwork {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::WriteBytes;

TEST(RemoveTree, DeletesADirectoryWithEverythingInIt) {
  TempDir tmp;
  const std::string root = tmp.File("step-00000005");
  WriteBytes(root + "/rank-00000.pt", "weights");
  WriteBytes(root + "/meta.json", "{}");
  WriteBytes(root + "/nested/deeper/file", "x");
  fs::create_directories(root + "/empty");
  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::is_directory(tmp.path()));  // only what it was given
}

TEST(RemoveTree, RemovesLinksWithoutFollowingThem) {
  TempDir tmp;
  WriteBytes(tmp.File("outside/keep"), "kept");
  const std::string root = tmp.File("tree");
  fs::create_directories(root);
  fs::create_directory_symlink(tmp.File("outside"), root + "/link");
  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(fs::exists(root));
  EXPECT_EQ(testing::ReadBytes(tmp.File("outside/keep")), "kept");
}

TEST(RemoveTree, APlainFileAndAMissingPath) {
  TempDir tmp;
  WriteBytes(tmp.File("file"), "x");
  EXPECT_TRUE(RemoveTree(tmp.File("file")).ok());
  EXPECT_FALSE(fs::exists(tmp.File("file")));
  EXPECT_TRUE(RemoveTree(tmp.File("never-there")).ok());
}

TEST(RemoveTree, NamesTheEntryItCannotDelete) {
  if (::geteuid() == 0) GTEST_SKIP() << "root deletes from a read-only directory: the failure cannot be made";
  TempDir tmp;
  const std::string locked = tmp.File("tree/locked");
  WriteBytes(locked + "/file", "x");
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  const Status s = RemoveTree(tmp.File("tree"));
  ::chmod(locked.c_str(), 0755);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(locked + "/file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("Permission denied"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace meshwork
