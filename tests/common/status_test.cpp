// The one Result type: with Status (everywhere) and with another error type (the Kubernetes
// client's), and the MW_* macros for both.
#include "common/status.h"

#include <string>

#include <gtest/gtest.h>

#include "common/enum_names.h"

namespace meshwork {
namespace {

// An error type of the k8s::Error shape: ok() and a message.
struct OtherError {
  int code = 0;
  bool ok() const { return code == 0; }
};

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidConfig("odd: " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  MW_ASSIGN_OR_RETURN(int h, Half(v));
  MW_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Result<std::string, OtherError> Named(int v) {
  if (v < 0) return OtherError{404};
  return std::to_string(v);
}

OtherError Check(int v) {
  MW_ASSIGN_OR_RETURN(std::string s, Named(v));
  return s.empty() ? OtherError{500} : OtherError{};
}

Status Both(int a, int b) {
  MW_RETURN_IF_ERROR(Half(a).status());
  MW_RETURN_IF_ERROR(Half(b).status());
  return Status::Ok();
}

TEST(Result, CarriesAValueOrTheStatusAndTheMacrosPassItOn) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_EQ(&r.status(), &r.error());
  EXPECT_TRUE(Both(2, 4).ok());
  EXPECT_EQ(Both(2, 5).message(), "odd: 5");
  EXPECT_EQ(ExitCodeFor(r.status().code()), exit_code::kConfig);
}

TEST(Result, TakesAnotherErrorType) {
  EXPECT_EQ(*Named(7), "7");
  EXPECT_EQ(Named(-1).error().code, 404);
  EXPECT_TRUE(Check(3).ok());
  EXPECT_EQ(Check(-3).code, 404);
}

enum class Color { kRed, kGreen };
constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kGreen, "green"}};

TEST(EnumNames, OneTableParsesPrintsAndLists) {
  EXPECT_EQ(ParseName(kColorNames, "green"), Color::kGreen);
  EXPECT_FALSE(ParseName(kColorNames, "Green").has_value());
  EXPECT_STREQ(NameOf(kColorNames, Color::kRed), "red");
  EXPECT_EQ(NameList(kColorNames), "red, green");
}

}  // namespace
}  // namespace meshwork
