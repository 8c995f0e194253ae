// metav1 Status bodies -> typed errors.
#include "operator/k8s/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace meshwork::k8s {
namespace {

using ::testing::HasSubstr;

std::string StatusBody(int code, const std::string& reason, const std::string& message) {
  return R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":")" + message +
         R"(","reason":")" + reason + R"(","code":)" + std::to_string(code) + "}";
}

struct Case {
  int code;
  std::string reason;
  ErrorKind want;
};

TEST(ErrorFromResponseTest, StatusCodesAndReasonsMapToKinds) {
  const Case cases[] = {
      {400, "BadRequest", ErrorKind::kBadRequest},
      {401, "Unauthorized", ErrorKind::kUnauthorized},
      {403, "Forbidden", ErrorKind::kForbidden},
      {404, "NotFound", ErrorKind::kNotFound},
      {405, "MethodNotAllowed", ErrorKind::kBadRequest},
      {409, "AlreadyExists", ErrorKind::kAlreadyExists},
      {409, "Conflict", ErrorKind::kConflict},
      {410, "Expired", ErrorKind::kGone},
      {413, "RequestEntityTooLarge", ErrorKind::kBadRequest},
      {415, "UnsupportedMediaType", ErrorKind::kBadRequest},
      {422, "Invalid", ErrorKind::kInvalid},
      {429, "TooManyRequests", ErrorKind::kTooManyRequests},
      {500, "InternalError", ErrorKind::kServerError},
      {503, "ServiceUnavailable", ErrorKind::kUnavailable},
      {504, "Timeout", ErrorKind::kUnavailable},
  };
  for (const auto& c : cases) {
    Error e = ErrorFromResponse(c.code, StatusBody(c.code, c.reason, "msg " + c.reason));
    EXPECT_EQ(e.kind(), c.want) << c.code << " " << c.reason << " -> " << e.ToString();
    EXPECT_EQ(e.http_code(), c.code);
    EXPECT_EQ(e.reason(), c.reason);
    EXPECT_EQ(e.message(), "msg " + c.reason);
  }
  EXPECT_TRUE(ErrorFromResponse(200, "{}").ok());
  EXPECT_TRUE(ErrorFromResponse(201, "{}").ok());
}

TEST(ErrorFromResponseTest, HelpersMatchTheirKindOnly) {
  Error nf = ErrorFromResponse(404, StatusBody(404, "NotFound", "pods \"x\" not found"));
  EXPECT_TRUE(IsNotFound(nf));
  EXPECT_FALSE(IsConflict(nf));
  EXPECT_FALSE(IsRetryable(nf));
  Error conflict = ErrorFromResponse(409, StatusBody(409, "Conflict", "the object has been modified"));
  EXPECT_TRUE(IsConflict(conflict));
  EXPECT_FALSE(IsAlreadyExists(conflict));
  EXPECT_TRUE(IsRetryable(ErrorFromResponse(503, "")));
  EXPECT_EQ(nf.ToStatus().code(), meshwork::StatusCode::kNotFound);
  EXPECT_EQ(ErrorFromResponse(503, "").ToStatus().code(), meshwork::StatusCode::kUnavailable);
}

TEST(ErrorFromResponseTest, InvalidCarriesEveryCause) {
  std::string body = R"({"kind":"Status","apiVersion":"v1","status":"Failure",
    "message":"TrainingJob.meshwork.dev \"j\" is invalid: [spec.replicas: Invalid value: -1, spec.mesh: Required value]",
    "reason":"Invalid","code":422,
    "details":{"name":"j","group":"meshwork.dev","kind":"TrainingJob","causes":[
      {"reason":"FieldValueInvalid","message":"Invalid value: -1: must be >= 1","field":"spec.replicas"},
      {"reason":"FieldValueRequired","message":"Required value","field":"spec.mesh"}]}})";
  Error e = ErrorFromResponse(422, body);
  ASSERT_TRUE(IsInvalid(e));
  ASSERT_EQ(e.causes().size(), 2u);
  EXPECT_EQ(e.causes()[0].field, "spec.replicas");
  EXPECT_EQ(e.causes()[0].reason, "FieldValueInvalid");
  EXPECT_EQ(e.causes()[1].field, "spec.mesh");
  EXPECT_THAT(e.ToString(), HasSubstr("spec.replicas: Invalid value: -1: must be >= 1"));
  EXPECT_EQ(e.ToStatus().code(), meshwork::StatusCode::kInvalidInput);
}

TEST(ErrorFromResponseTest, RetryAfterFromHeaderThenDetailsThenDefault) {
  std::string body = R"({"kind":"Status","code":429,"reason":"TooManyRequests","message":"slow down",
    "details":{"retryAfterSeconds":7}})";
  EXPECT_EQ(ErrorFromResponse(429, body, "3").retry_after(), std::chrono::seconds(3));
  EXPECT_EQ(ErrorFromResponse(429, body, "").retry_after(), std::chrono::seconds(7));
  EXPECT_EQ(ErrorFromResponse(429, "", "").retry_after(), std::chrono::seconds(1));
  EXPECT_TRUE(IsTooManyRequests(ErrorFromResponse(429, "", "")));
}

TEST(ErrorFromResponseTest, NonStatusBodiesStillGiveAKindAndAnExcerpt) {
  Error e = ErrorFromResponse(502, "<html>bad gateway</html>");
  EXPECT_EQ(e.kind(), ErrorKind::kServerError);
  EXPECT_THAT(e.message(), HasSubstr("502"));
  EXPECT_THAT(e.message(), HasSubstr("bad gateway"));
  Error empty = ErrorFromResponse(404, "");
  EXPECT_TRUE(IsNotFound(empty));
  EXPECT_FALSE(empty.message().empty());
}

TEST(ErrorFromStatusObjectTest, WatchErrorEventStatusUsesItsCode) {
  Error gone = ErrorFromStatusObject(StatusBody(410, "Expired", "too old resource version: 5 (100)"));
  EXPECT_TRUE(IsGone(gone));
  EXPECT_EQ(gone.http_code(), 410);
  EXPECT_THAT(gone.message(), HasSubstr("too old"));
  Error by_reason = ErrorFromStatusObject(R"({"kind":"Status","reason":"Expired","message":"x"})");
  EXPECT_TRUE(IsGone(by_reason));
  EXPECT_EQ(ErrorFromStatusObject("not json").kind(), ErrorKind::kInvalidResponse);
}

TEST(ResultTest, CarriesValueOrError) {
  Result<int> ok = 3;
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
  Result<int> bad = Error(ErrorKind::kNotFound, "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(IsNotFound(bad.error()));
}

}  // namespace
}  // namespace meshwork::k8s
