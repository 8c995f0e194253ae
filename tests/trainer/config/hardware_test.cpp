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

// auto: bf16 under autocast with the fused norms only (the composition would keep an fp32 copy
// of a bf16 stream); fp32 always; bf16 wherever autocast runs, an error without it.
TEST(UsesBf16ResidualTest, AutoNeedsAutocastAndTheFusedNormsAndBf16WithoutAutocastIsAnError) {
  TrainConfig cfg;
  ASSERT_TRUE(UsesBf16Residual(cfg, true, true).ok());
  EXPECT_TRUE(*UsesBf16Residual(cfg, true, true));
  EXPECT_FALSE(*UsesBf16Residual(cfg, true, false));
  EXPECT_FALSE(*UsesBf16Residual(cfg, false, true));
  cfg.training.residual_dtype = ResidualDtype::kFp32;
  EXPECT_FALSE(*UsesBf16Residual(cfg, true, true));
  EXPECT_FALSE(*UsesBf16Residual(cfg, false, false));
  cfg.training.residual_dtype = ResidualDtype::kBf16;
  EXPECT_TRUE(*UsesBf16Residual(cfg, true, true));
  EXPECT_TRUE(*UsesBf16Residual(cfg, true, false));
  cfg.training.device = "auto";
  const Result<bool> r = UsesBf16Residual(cfg, false, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(r.status().message().find("'training.residual_dtype': bf16 needs bf16 autocast"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("training.device 'auto'"), std::string::npos) << r.status().message();
}

// The compiler's shape counts the stream at the size it runs: bf16 under autocast with the
// fused norms (which the CUDA flavor builds), fp32 otherwise.
TEST(TrainingShapeTest, CountsTheResidualStreamAtItsDtype) {
  TrainConfig cfg;
  EXPECT_EQ(TrainingShape(cfg, true).residual_bytes, 2);
  EXPECT_EQ(TrainingShape(cfg, true).activation_bytes, 2);
  EXPECT_EQ(TrainingShape(cfg, false).residual_bytes, 4);
  cfg.training.fused_kernels = FusedKernels::kOff;
  EXPECT_EQ(TrainingShape(cfg, true).residual_bytes, 4);
  cfg.training.residual_dtype = ResidualDtype::kBf16;
  EXPECT_EQ(TrainingShape(cfg, true).residual_bytes, 2);
  cfg.training.fused_kernels = FusedKernels::kAuto;
  cfg.training.residual_dtype = ResidualDtype::kFp32;
  EXPECT_EQ(TrainingShape(cfg, true).residual_bytes, 4);
}

TEST(StoresLossGradientTest, AutoStoresOnCudaAndUnderZeroBubbleOnly) {
  TrainConfig cfg;
  EXPECT_TRUE(StoresLossGradient(cfg, true));
  EXPECT_FALSE(StoresLossGradient(cfg, false));
  cfg.pipeline.schedule = PipelineSchedule::kZeroBubbleH1;
  EXPECT_FALSE(StoresLossGradient(cfg, false)) << "no pipeline (mesh.pp 1)";
  cfg.mesh.pp = 2;
  EXPECT_TRUE(StoresLossGradient(cfg, false));
  cfg.pipeline.schedule = PipelineSchedule::k1F1B;
  EXPECT_FALSE(StoresLossGradient(cfg, false));
  cfg.pipeline.schedule = PipelineSchedule::kZeroBubbleH1;
  cfg.training.loss_gradient = LossGradient::kStored;
  EXPECT_TRUE(StoresLossGradient(cfg, false));
  cfg.training.loss_gradient = LossGradient::kRecompute;
  EXPECT_FALSE(StoresLossGradient(cfg, true));
}

}  // namespace
}  // namespace meshwork::config

namespace meshwork::config {
namespace {

// The fsdp.* keys as the planner takes them, once for the trainer, mesh: auto and the simulator.
TEST(PlanOptionsOfTest, MapsTheFsdpKeysAndTensorParallelismTurnsTheRowsAndTheSplitHeadOff) {
  FsdpConfig fsdp;
  fsdp.bucketing = compiler::Bucketing::kBlock;
  fsdp.reorder = false;
  fsdp.reshard_after_forward = false;
  const compiler::PlanOptions o = PlanOptionsOf(fsdp);
  EXPECT_EQ(o.bucketing, compiler::Bucketing::kBlock);
  EXPECT_FALSE(o.reorder);
  EXPECT_FALSE(o.reshard_after_forward);
  EXPECT_EQ(o.read_by_rows, compiler::PlanOptions::Rows::kWhenFaster);
  EXPECT_EQ(o.split_by_vocabulary, compiler::PlanOptions::Rows::kWhenFaster);
  fsdp.embedding_rows = false;
  EXPECT_EQ(PlanOptionsOf(fsdp).read_by_rows, compiler::PlanOptions::Rows::kNever);
  EXPECT_EQ(PlanOptionsOf(fsdp).split_by_vocabulary, compiler::PlanOptions::Rows::kWhenFaster);
  fsdp.embedding_rows = true;
  const compiler::PlanOptions tp = PlanOptionsOf(fsdp, /*tensor_parallel=*/true);
  EXPECT_EQ(tp.read_by_rows, compiler::PlanOptions::Rows::kNever);
  EXPECT_EQ(tp.split_by_vocabulary, compiler::PlanOptions::Rows::kNever);
}

// The schedule a pipeline config runs, as the engine and the operator's admission both get it:
// the config's shape, or an error naming pipeline.schedule and the micro-batches.
TEST(PipelineProgramTest, GeneratesTheConfigsScheduleAtItsShapeOrNamesTheKeys) {
  TrainConfig cfg;
  cfg.mesh.pp = 2;
  cfg.training.grad_accum = 4;
  cfg.pipeline.schedule = PipelineSchedule::k1F1B;
  auto program = PipelineProgram(cfg);
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(program->shape.pp, 2);
  EXPECT_EQ(program->shape.microbatches, 4);
  EXPECT_EQ(program->shape.virtual_stages, 1);
  EXPECT_EQ(program->ranks.size(), 2u);

  cfg.pipeline.schedule = PipelineSchedule::kInterleaved1F1B;
  cfg.pipeline.virtual_stages = 2;
  auto interleaved = PipelineProgram(cfg);
  ASSERT_TRUE(interleaved.ok()) << interleaved.status().message();
  EXPECT_EQ(interleaved->shape.stages(), 4);

  // 1F1B needs at least pp micro-batches; interleaving a multiple of pp.
  cfg.pipeline.schedule = PipelineSchedule::k1F1B;
  cfg.pipeline.virtual_stages = 1;
  cfg.training.grad_accum = 1;
  auto few = PipelineProgram(cfg);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(few.status().message().find("key 'pipeline.schedule'"), std::string::npos) << few.status().message();
  EXPECT_NE(few.status().message().find("training.grad_accum=1"), std::string::npos) << few.status().message();
  cfg.pipeline.schedule = PipelineSchedule::kInterleaved1F1B;
  cfg.pipeline.virtual_stages = 2;
  cfg.training.grad_accum = 3;
  EXPECT_FALSE(PipelineProgram(cfg).ok());
}

}  // namespace
}  // namespace meshwork::config
