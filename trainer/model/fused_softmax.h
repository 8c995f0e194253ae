// The arithmetic of the output head's fused softmax gradient (fused_ops.h SoftmaxGradientInPlace),
// shared by the CUDA kernel (fused_kernels.cu) and the host loop (fused_ops.cpp) like
// fused_elementwise.h. A row of logits is read in packs of N columns (kPack<T> where the
// vocabulary is a multiple of it and the logits aligned: PackFor; else 1) and reduced by
// kRowThreads lanes: lane k folds packs k, k + kRowThreads, ... into a running (max, sum of exp)
// pair, then a tree merges the lanes' pairs (stride kRowThreads / 2, then / 4, ..., lane i
// merging lane i + stride): the device runs the lanes as a block's threads with a barrier
// between the tree's steps, the host runs them one after another in the same order, so the CPU
// tests check the same partition and tree the GPU runs.
#pragma once

#include <math.h>

#include <cstdint>

#include "trainer/model/fused_elementwise.h"

namespace meshwork::model::fused {

// Lanes (a CUDA block's threads) per row: a power of two.
inline constexpr int kRowThreads = 512;

MW_HOST_DEVICE float Log(float x) { return logf(x); }
MW_HOST_DEVICE double Log(double x) { return log(x); }

// exp-sums relative to a running maximum: the softmax denominator of the columns seen so far is
// sum * exp(max). An empty pair has sum 0 (max is then unused).
template <typename Acc>
struct SoftmaxStats {
  Acc max;
  Acc sum;
};

template <typename Acc>
MW_HOST_DEVICE SoftmaxStats<Acc> MergeStats(SoftmaxStats<Acc> a, SoftmaxStats<Acc> b) {
  if (b.sum == Acc(0)) return a;
  if (a.sum == Acc(0)) return b;
  if (a.max >= b.max) return {a.max, a.sum + b.sum * Exp(b.max - a.max)};
  return {b.max, b.sum + a.sum * Exp(a.max - b.max)};
}

// x folded into the running pair. A -inf logit adds nothing (exp(-inf) = 0; taking it as a
// maximum would give exp(-inf - -inf) = NaN); a row of nothing but -inf ends with sum 0:
// log-sum-exp -inf, as torch::logsumexp.
template <typename Acc>
MW_HOST_DEVICE void Fold(SoftmaxStats<Acc>& s, Acc x) {
  if (x == -static_cast<Acc>(INFINITY)) return;
  if (s.sum == Acc(0)) {
    s = {x, Acc(1)};
  } else if (x > s.max) {
    s = {x, s.sum * Exp(s.max - x) + Acc(1)};
  } else {
    s.sum += Exp(x - s.max);
  }
}

// Lane `lane`'s pair over packs lane, lane + kRowThreads, ... of `row` [vocab].
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE SoftmaxStats<Acc> LaneStats(const T* row, int64_t vocab, int lane) {
  SoftmaxStats<Acc> s{Acc(0), Acc(0)};
  for (int64_t v = lane; v < vocab / N; v += kRowThreads) {
    const Pack<T, N> p = LoadPack<N>(row + v * N);
    MW_UNROLL
    for (int k = 0; k < N; ++k) Fold(s, static_cast<Acc>(p.v[k]));
  }
  return s;
}

// One step of the lanes' tree: lane < stride merges lane + stride's pair into its own.
template <typename Acc>
MW_HOST_DEVICE void TreeStep(SoftmaxStats<Acc>* lanes, int lane, int stride) {
  if (lane < stride) lanes[lane] = MergeStats(lanes[lane], lanes[lane + stride]);
}

template <typename Acc>
MW_HOST_DEVICE Acc LogSumExp(SoftmaxStats<Acc> s) {
  return s.sum == Acc(0) ? -static_cast<Acc>(INFINITY) : s.max + Log(s.sum);
}

// Pack v of the row's gradient in place: softmax - onehot(target), rounded to T.
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE void SoftmaxGradientAt(T* row, int64_t v, int64_t target, Acc lse) {
  Pack<T, N> p = LoadPack<N>(row + v * N);
  MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const Acc e = Exp(static_cast<Acc>(p.v[k]) - lse);
    p.v[k] = static_cast<T>(v * N + k == target ? e - Acc(1) : e);
  }
  StorePack(row + v * N, p);
}

}  // namespace meshwork::model::fused
