#include "common/base64.h"

#include <gtest/gtest.h>

#include <string>

namespace meshwork {
namespace {

// RFC 4648 section 10 test vectors.
TEST(Base64Test, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded) << plain;
    auto back = Base64Decode(encoded);
    ASSERT_TRUE(back.has_value()) << encoded;
    EXPECT_EQ(*back, plain);
  }
}

TEST(Base64Test, BinaryRoundTripsAndWhitespaceOrMissingPaddingIsFine) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(*Base64Decode(Base64Encode(bytes)), bytes);
  EXPECT_EQ(*Base64Decode("Zm9v\nYmE"), "fooba");
  EXPECT_EQ(*Base64Decode(" Zg "), "f");
}

TEST(Base64Test, BadInputSaysWhy) {
  std::string why;
  EXPECT_FALSE(Base64Decode("Zm9v!", &why).has_value());
  EXPECT_EQ(why, "unexpected character '!'");
  EXPECT_FALSE(Base64Decode("Zg==Zg", &why).has_value());
  EXPECT_EQ(why, "data after '=' padding");
  EXPECT_FALSE(Base64Decode("Zm9vY", &why).has_value());
  EXPECT_EQ(why, "truncated input");
}

}  // namespace
}  // namespace meshwork
