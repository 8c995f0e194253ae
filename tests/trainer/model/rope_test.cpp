// Rotary position embeddings against hand-computed values: HF's rotate_half layout, the
// relative-position property, and Llama 3's frequency-dependent rope scaling.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "trainer/model/llama.h"

namespace meshwork::model {
namespace {

LlamaConfig HeadDim4Config() {
  LlamaConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;  // head dim 4
  c.num_key_value_heads = 2;
  c.rope_theta = 10000.0;
  return c;
}

TEST(RopeTest, InverseFrequenciesForHeadDim4AreOneAndOneHundredth) {
  auto inv = RopeInverseFrequencies(HeadDim4Config());
  ASSERT_EQ(inv.sizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(inv.scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(inv[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(inv[1].item<float>(), 0.01f);
}

TEST(RopeTest, InverseFrequenciesWithoutScalingAreThetaPowers) {
  LlamaConfig c;
  c.hidden_size = 256;
  c.num_attention_heads = 4;  // head dim 64
  c.rope_theta = 500000.0;
  auto inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.numel(), 32);
  for (int64_t i = 0; i < 32; ++i) {
    const double expected = 1.0 / std::pow(500000.0, 2.0 * i / 64.0);
    EXPECT_FLOAT_EQ(inv[i].item<float>(), static_cast<float>(expected)) << "i=" << i;
  }
}

TEST(RopeTest, TablesMatchCosSinOfPositionTimesFrequencyInHalfLayout) {
  RopeTables rope = MakeRopeTables(HeadDim4Config(), 3, torch::kCPU);
  ASSERT_EQ(rope.cos.sizes(), (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(rope.sin.sizes(), (std::vector<int64_t>{3, 4}));
  const double inv_freq[2] = {1.0, 0.01};
  for (int64_t pos = 0; pos < 3; ++pos) {
    for (int64_t j = 0; j < 4; ++j) {
      // HF layout: emb = cat(freqs, freqs), so column j uses frequency j % (head_dim / 2).
      const double angle = static_cast<double>(pos) * inv_freq[j % 2];
      EXPECT_FLOAT_EQ(rope.cos[pos][j].item<float>(), static_cast<float>(std::cos(angle)))
          << "pos=" << pos << " j=" << j;
      EXPECT_FLOAT_EQ(rope.sin[pos][j].item<float>(), static_cast<float>(std::sin(angle)))
          << "pos=" << pos << " j=" << j;
    }
  }
  // Position 0 is the identity rotation.
  EXPECT_TRUE(torch::equal(rope.cos[0], torch::ones({4})));
  EXPECT_TRUE(torch::equal(rope.sin[0], torch::zeros({4})));
}

TEST(RopeTest, ApplyRopeAtPositionOneMatchesRotateHalfByHand) {
  RopeTables rope = MakeRopeTables(HeadDim4Config(), 2, torch::kCPU);
  // [batch 1, heads 1, seq 2, head_dim 4]; the hand vector sits at position 1.
  auto x = torch::tensor({0.5f, -1.0f, 2.0f, 0.25f, 1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 2, 4});
  auto y = ApplyRope(x, rope);
  ASSERT_EQ(y.sizes(), x.sizes());

  // rotate_half([a, b, c, d]) = [-c, -d, a, b]; angles at position 1 are [1, 0.01, 1, 0.01].
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  const double expected[4] = {1 * c1 + -3 * s1, 2 * c2 + -4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(y[0][0][1][j].item<float>(), expected[j], 1e-6) << "j=" << j;
  }
  // Position 0 is left unchanged.
  EXPECT_TRUE(torch::allclose(y[0][0][0], x[0][0][0]));
}

TEST(RopeTest, ApplyRopeUsesOnlyTheFirstSeqRowsOfLongerTables) {
  RopeTables long_tables = MakeRopeTables(HeadDim4Config(), 16, torch::kCPU);
  RopeTables exact_tables = MakeRopeTables(HeadDim4Config(), 5, torch::kCPU);
  torch::manual_seed(0);
  auto x = torch::randn({2, 3, 5, 4});
  EXPECT_TRUE(torch::allclose(ApplyRope(x, long_tables), ApplyRope(x, exact_tables)));
}

TEST(RopeTest, ApplyRopePreservesNorm) {
  LlamaConfig c = HeadDim4Config();
  c.hidden_size = 32;
  c.num_attention_heads = 2;  // head dim 16
  RopeTables rope = MakeRopeTables(c, 12, torch::kCPU);
  torch::manual_seed(1);
  auto x = torch::randn({2, 2, 12, 16});
  auto y = ApplyRope(x, rope);
  EXPECT_TRUE(torch::allclose(y.norm(2, -1), x.norm(2, -1), 1e-5, 1e-5));
}

TEST(RopeTest, QueryKeyDotProductDependsOnlyOnRelativePosition) {
  LlamaConfig c;
  c.hidden_size = 16;
  c.num_attention_heads = 2;  // head dim 8
  c.rope_theta = 100.0;       // fast-turning frequencies so every position differs
  const int64_t seq = 10, d = 8;
  RopeTables rope = MakeRopeTables(c, seq, torch::kCPU);
  torch::manual_seed(2);
  auto q = torch::randn({d}, torch::kDouble);
  auto k = torch::randn({d}, torch::kDouble);
  // The same q (and k) at every position, so row m of the result is rope(q, m).
  auto rq = ApplyRope(q.expand({1, 1, seq, d}).contiguous(), rope)[0][0];
  auto rk = ApplyRope(k.expand({1, 1, seq, d}).contiguous(), rope)[0][0];
  auto dot = torch::matmul(rq, rk.t());  // dot[m][n] = <rope(q, m), rope(k, n)>
  for (int64_t m = 0; m < seq; ++m) {
    for (int64_t n = 0; n < seq; ++n) {
      const int64_t shift = std::min(m, n);  // compare with the pair moved back to start at 0
      EXPECT_NEAR(dot[m][n].item<double>(), dot[m - shift][n - shift].item<double>(), 1e-5)
          << "m=" << m << " n=" << n;
    }
  }
  // And it does depend on the offset: not a constant.
  EXPECT_GT(std::abs(dot[0][1].item<double>() - dot[0][4].item<double>()), 1e-3);
}

// Llama 3's rope scaling, written out from the published reference (HF's
// _compute_llama3_parameters / Meta's apply_scaling).
std::vector<double> Llama3ScaledInverseFrequencies(int64_t head_dim, double theta, double factor,
                                                   double low_freq_factor, double high_freq_factor,
                                                   double original_len) {
  const double low_freq_wavelen = original_len / low_freq_factor;
  const double high_freq_wavelen = original_len / high_freq_factor;
  std::vector<double> out;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double inv = 1.0 / std::pow(theta, (2.0 * i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * M_PI / inv;
    if (wavelen < high_freq_wavelen) {
      out.push_back(inv);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(inv / factor);
    } else {
      const double smooth =
          (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back((1.0 - smooth) * inv / factor + smooth * inv);
    }
  }
  return out;
}

TEST(RopeTest, Llama3ScalingMatchesPublishedFormulaForEveryFrequency) {
  auto preset = PresetConfig("llama3-1b");
  ASSERT_TRUE(preset.ok());
  const LlamaConfig c = preset.value();
  auto inv = RopeInverseFrequencies(c);
  const auto expected = Llama3ScaledInverseFrequencies(64, 500000.0, 32.0, 1.0, 4.0, 8192.0);
  ASSERT_EQ(inv.numel(), static_cast<int64_t>(expected.size()));
  ASSERT_EQ(inv.numel(), 32);
  for (int64_t i = 0; i < inv.numel(); ++i) {
    EXPECT_NEAR(inv[i].item<float>(), expected[i], 1e-6 * expected[i]) << "i=" << i;
  }
}

TEST(RopeTest, Llama3ScalingKeepsHighFrequenciesAndDividesLowestBy32) {
  auto preset = PresetConfig("llama3-1b");
  ASSERT_TRUE(preset.ok());
  LlamaConfig scaled_config = preset.value();
  LlamaConfig plain_config = scaled_config;
  plain_config.rope_scaling.factor = 0.0;
  auto scaled = RopeInverseFrequencies(scaled_config);
  auto plain = RopeInverseFrequencies(plain_config);

  int high = 0, low = 0, medium = 0;
  for (int64_t i = 0; i < plain.numel(); ++i) {
    const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 64.0);
    const double wavelen = 2.0 * M_PI / inv;
    if (wavelen < 8192.0 / 4.0) {
      ++high;
      EXPECT_EQ(scaled[i].item<float>(), plain[i].item<float>()) << "high-frequency i=" << i;
    } else if (wavelen > 8192.0) {
      ++low;
      EXPECT_FLOAT_EQ(scaled[i].item<float>(), plain[i].item<float>() / 32.0f)
          << "low-frequency i=" << i;
    } else {
      ++medium;
      // Interpolated: strictly between the unscaled and the fully scaled value.
      EXPECT_LT(scaled[i].item<float>(), plain[i].item<float>()) << "i=" << i;
      EXPECT_GT(scaled[i].item<float>(), plain[i].item<float>() / 32.0f) << "i=" << i;
    }
  }
  // The preset exercises all three bands.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
  EXPECT_EQ(scaled[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(scaled[31].item<float>(), plain[31].item<float>() / 32.0f);
}

TEST(RopeTest, TablesUseScaledFrequencies) {
  auto preset = PresetConfig("llama3-1b");
  ASSERT_TRUE(preset.ok());
  const LlamaConfig c = preset.value();
  RopeTables rope = MakeRopeTables(c, 4, torch::kCPU);
  auto inv = RopeInverseFrequencies(c).to(torch::kDouble);
  ASSERT_EQ(rope.cos.sizes(), (std::vector<int64_t>{4, 64}));
  for (int64_t j : {0, 10, 20, 31}) {
    const double angle = 3.0 * inv[j].item<double>();
    EXPECT_FLOAT_EQ(rope.cos[3][j].item<float>(), static_cast<float>(std::cos(angle)));
    EXPECT_FLOAT_EQ(rope.sin[3][j + 32].item<float>(), static_cast<float>(std::sin(angle)));
  }
}

}  // namespace
}  // namespace meshwork::model
