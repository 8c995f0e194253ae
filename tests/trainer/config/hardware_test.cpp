// The per-device choices a trainer config resolves to (config/hardware.h): which head gradient
// and whether the fused kernels run, for each value, device and build.
#include <gtest/gtest.h>

#include "trainer/config/config.h"
#include "trainer/config/hardware.h"

namespace meshwork::config {
namespace {

struct FusedCase {
  FusedKernels value;
  bool cuda, built;
  bool fused;      // when ok
  bool error;      // an InvalidConfig naming the key
};

TEST(UsesFusedKernelsTest, AutoIsOnCudaWithKernelsOnAndOffAsSaid) {
  const FusedCase cases[] = {
      {FusedKernels::kAuto, true, true, true, false},   {FusedKernels::kAuto, true, false, false, false},
      {FusedKernels::kAuto, false, true, false, false}, {FusedKernels::kAuto, false, false, false, false},
      {FusedKernels::kOn, true, true, true, false},     {FusedKernels::kOn, true, false, false, true},
      {FusedKernels::kOn, false, false, true, false},   {FusedKernels::kOff, true, true, false, false},
      {FusedKernels::kOff, false, false, false, false},
  };
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "value " << static_cast<int>(c.value) << " cuda " << c.cuda << " built "
                                    << c.built);
    TrainConfig cfg;
    cfg.training.fused_kernels = c.value;
    const Result<bool> r = UsesFusedKernels(cfg, c.cuda, c.built);
    if (c.error) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
      EXPECT_NE(r.status().message().find("'training.fused_kernels': on"), std::string::npos) << r.status().message();
    } else {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(*r, c.fused);
    }
  }
}

TEST(UsesBf16ResidualTest, AutoFollowsAutocastAndBf16WithoutItIsAnError) {
  TrainConfig cfg;
  ASSERT_TRUE(UsesBf16Residual(cfg, true).ok());
  EXPECT_TRUE(*UsesBf16Residual(cfg, true));
  EXPECT_FALSE(*UsesBf16Residual(cfg, false));
  cfg.training.residual_dtype = ResidualDtype::kFp32;
  EXPECT_FALSE(*UsesBf16Residual(cfg, true));
  EXPECT_FALSE(*UsesBf16Residual(cfg, false));
  cfg.training.residual_dtype = ResidualDtype::kBf16;
  EXPECT_TRUE(*UsesBf16Residual(cfg, true));
  cfg.training.device = "auto";
  const Result<bool> r = UsesBf16Residual(cfg, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(r.status().message().find("'training.residual_dtype': bf16 needs bf16 autocast"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("training.device 'auto'"), std::string::npos) << r.status().message();
}

TEST(StoresLossGradientTest, AutoStoresOnCudaOnly) {
  TrainConfig cfg;
  EXPECT_TRUE(StoresLossGradient(cfg, true));
  EXPECT_FALSE(StoresLossGradient(cfg, false));
  cfg.training.loss_gradient = LossGradient::kStored;
  EXPECT_TRUE(StoresLossGradient(cfg, false));
  cfg.training.loss_gradient = LossGradient::kRecompute;
  EXPECT_FALSE(StoresLossGradient(cfg, true));
}

}  // namespace
}  // namespace meshwork::config
