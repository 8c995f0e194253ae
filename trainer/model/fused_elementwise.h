// The arithmetic of Meshwork's fused elementwise ops (SwiGLU, rotary embedding), one pack of N
// consecutive output elements per call: N = kPack<T> (16 bytes, one GPU access) where every
// extent and address allows it (PackFor), else 1. The CUDA kernels (fused_kernels.cu) and the
// host loops (fused_ops.cpp) both run these same functions with the same N, so the CPU tests
// check the code the GPU runs, short of the launch. Torch-free and nvcc-safe: T is the storage
// type (float, double, c10::BFloat16, c10::Half), Acc the arithmetic type (float, or double for
// double), converted with static_cast.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#if defined(__CUDACC__)
#define MW_HOST_DEVICE __host__ __device__ __forceinline__
#define MW_UNROLL _Pragma("unroll")
#else
#define MW_HOST_DEVICE inline
#define MW_UNROLL
#endif

namespace meshwork::model::fused {

MW_HOST_DEVICE float Exp(float x) { return expf(x); }
MW_HOST_DEVICE double Exp(double x) { return exp(x); }

template <typename Acc>
MW_HOST_DEVICE Acc Sigmoid(Acc x) {
  return Acc(1) / (Acc(1) + Exp(-x));
}

// N consecutive elements, aligned to their size, so that a GPU moves them in one access (a
// 16-byte load is the widest; 2-byte loads leave most of an H200's bandwidth unused: the
// element-at-a-time SwiGLU kernel read and wrote at 1.4 TB/s).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of `bytes` each in one 16-byte pack; kPack<T> for T.
constexpr int PackOf(size_t bytes) { return bytes >= 16 ? 1 : static_cast<int>(16 / bytes); }
template <typename T>
inline constexpr int kPack = PackOf(sizeof(T));

// On the device a pack of whole 16-byte words moves as uint4s: copied as a struct, nvcc sometimes
// splits a pack of bf16 into 2-byte stores.
template <int N, typename T>
MW_HOST_DEVICE Pack<T, N> LoadPack(const T* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    Pack<T, N> x;
    MW_UNROLL
    for (size_t w = 0; w < sizeof(x) / 16; ++w) reinterpret_cast<uint4*>(&x)[w] = reinterpret_cast<const uint4*>(p)[w];
    return x;
  }
#endif
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <int N, typename T>
MW_HOST_DEVICE void StorePack(T* p, const Pack<T, N>& x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    MW_UNROLL
    for (size_t w = 0; w < sizeof(x) / 16; ++w) reinterpret_cast<uint4*>(p)[w] = reinterpret_cast<const uint4*>(&x)[w];
    return;
  }
#endif
  *reinterpret_cast<Pack<T, N>*>(p) = x;
}

// StorePack where nvcc would split the store: on the device each 16-byte word goes out as one
// st.global.v4.u32. A pack assembled element by element from values computed out of order (RoPE's
// two halves) is otherwise stored as four 4-byte STG.E per word (read in the SASS of sm_90),
// where SwiGLU's and the softmax's packs get one STG.E.128. The asm clobbers memory, so nothing
// moves across it; that costs some unrolling in loops that store and load in turn (the norm
// forward, left on StorePack), none in RoPE's one store per thread and pack.
template <int N, typename T>
MW_HOST_DEVICE void StorePackWide(T* p, const Pack<T, N>& x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    MW_UNROLL
    for (size_t w = 0; w < sizeof(x) / 16; ++w) {
      const uint4 word = reinterpret_cast<const uint4*>(&x)[w];
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(p) + w), "r"(word.x),
                   "r"(word.y), "r"(word.z), "r"(word.w)
                   : "memory");
    }
    return;
  }
#endif
  StorePack<N>(p, x);
}

// One array an op reads or writes: its address (null: absent) and element size.
struct PackArray {
  const void* address;
  size_t bytes;
};

// The pack width every op's kernel and host loop use: kPack of the narrowest array's type where
// every extent (a row's width, a stride) is a whole number of packs and every array is aligned to
// its own pack, else 1. Host only.
inline int PackFor(std::initializer_list<int64_t> extents, std::initializer_list<PackArray> arrays) {
  size_t narrowest = 16;
  for (const PackArray& a : arrays) {
    if (a.address != nullptr && a.bytes < narrowest) narrowest = a.bytes;
  }
  const int n = PackOf(narrowest);
  for (const int64_t e : extents) {
    if (e % n != 0) return 1;
  }
  for (const PackArray& a : arrays) {
    if (a.address != nullptr && reinterpret_cast<uintptr_t>(a.address) % (static_cast<uintptr_t>(n) * a.bytes) != 0) {
      return 1;
    }
  }
  return n;
}

// For n elements of arrays of one element size, each starting anywhere within a 16-byte line
// (an FSDP shard is a view of its flat group at any element): the first element from which every
// array is aligned to a pack of PackOf(bytes) elements. That is one element for all of them
// where they share their offset within the line (0 where all are aligned); else, or where no
// whole pack follows it, or an address is not a multiple of its element size, -1: no packs.
// Host only.
inline int64_t CommonPackStart(int64_t n, std::initializer_list<PackArray> arrays) {
  if (arrays.size() == 0) return -1;
  const size_t bytes = arrays.begin()->bytes;
  const uintptr_t line = static_cast<uintptr_t>(PackOf(bytes)) * bytes;
  int64_t start = -1;
  for (const PackArray& a : arrays) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(a.address);
    if (a.address == nullptr || a.bytes != bytes || address % bytes != 0) return -1;
    const auto mine = static_cast<int64_t>(((line - address % line) % line) / bytes);
    if (start >= 0 && mine != start) return -1;
    start = mine;
  }
  return start + PackOf(bytes) <= n ? start : -1;
}

// Calls fn(std::integral_constant<int, N>{}) for pack width N = 1 or PackOf(Bytes) and returns
// true; false for any other width. Host only. VisitPack<T>: Bytes = sizeof(T).
template <size_t Bytes, typename Fn>
bool VisitPackBytes(int pack, Fn&& fn) {
  if (pack == 1) {
    fn(std::integral_constant<int, 1>{});
    return true;
  }
  if (pack == PackOf(Bytes)) {
    fn(std::integral_constant<int, PackOf(Bytes)>{});
    return true;
  }
  return false;
}
template <typename T, typename Fn>
bool VisitPack(int pack, Fn&& fn) {
  return VisitPackBytes<sizeof(T)>(pack, fn);
}

MW_HOST_DEVICE uint32_t MulHi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// Division by a fixed divisor as a multiply-high, an add and a shift (Granlund and Montgomery's
// method), for dividends below 2^31: a 64-bit division is a long subroutine on a GPU, and the
// index arithmetic of an elementwise kernel would otherwise cost more than its memory traffic.
// Built on the host for the largest dividend the kernel will see; beyond 2^31 it divides plainly.
struct Divider {
  int64_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;
  bool fast = false;

  Divider() = default;
  Divider(int64_t d, int64_t max_dividend) : divisor(d) {
    constexpr int64_t kLimit = int64_t{1} << 31;
    fast = d >= 1 && d < kLimit && max_dividend < kLimit;
    if (!fast) return;
    while ((int64_t{1} << shift) < d) ++shift;  // shift = ceil(log2(d)) <= 31
    // multiplier = floor(2^32 * (2^shift - d) / d) + 1, which fits 32 bits.
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * static_cast<uint64_t>((int64_t{1} << shift) - d)) /
                                           static_cast<uint64_t>(d) +
                                       1);
  }

  MW_HOST_DEVICE int64_t Div(int64_t n) const {
    if (!fast) return n / divisor;
    const uint32_t x = static_cast<uint32_t>(n);
    return static_cast<int64_t>((MulHi(x, multiplier) + x) >> shift);
  }
};

// SwiGLU of the merged gate/up GEMM's output: gate_up [rows, 2f] holds gate in columns [0, f)
// and up in [f, 2f) (the order MlpImpl concatenates their weights). Element i of out [rows, f]
// is silu(gate) * up, rounded to T once (the composition rounds silu(gate) first). Pack v holds
// out's elements [v * N, v * N + N), all in one row (PackFor({f}, ...)); per_row divides by f / N.
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE void SwiGluForwardAt(int64_t v, const Divider& per_row, const T* gate_up, T* out) {
  const int64_t packs = per_row.divisor, f = packs * N;
  const int64_t row = per_row.Div(v), col = (v - row * packs) * N;
  const Pack<T, N> g = LoadPack<N>(gate_up + row * 2 * f + col);
  const Pack<T, N> u = LoadPack<N>(gate_up + row * 2 * f + f + col);
  Pack<T, N> o;
MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const Acc gk = static_cast<Acc>(g.v[k]);
    o.v[k] = static_cast<T>(gk * Sigmoid(gk) * static_cast<Acc>(u.v[k]));
  }
  StorePack(out + v * N, o);
}

// Its backward for output pack v: d/dgate = dy * up * s * (1 + g * (1 - s)) with s =
// sigmoid(g), d/dup = dy * silu(g), written into grad_gate_up [rows, 2f] (gate's half, up's half).
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE void SwiGluBackwardAt(int64_t v, const Divider& per_row, const T* gate_up, const T* grad_out,
                                     T* grad_gate_up) {
  const int64_t packs = per_row.divisor, f = packs * N;
  const int64_t row = per_row.Div(v), col = (v - row * packs) * N;
  const int64_t at = row * 2 * f + col;
  const Pack<T, N> g = LoadPack<N>(gate_up + at);
  const Pack<T, N> u = LoadPack<N>(gate_up + at + f);
  const Pack<T, N> dy = LoadPack<N>(grad_out + v * N);
  Pack<T, N> dg, du;
MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const Acc gk = static_cast<Acc>(g.v[k]), uk = static_cast<Acc>(u.v[k]), dyk = static_cast<Acc>(dy.v[k]);
    const Acc s = Sigmoid(gk);
    dg.v[k] = static_cast<T>(dyk * uk * s * (Acc(1) + gk * (Acc(1) - s)));
    du.v[k] = static_cast<T>(dyk * gk * s);
  }
  StorePack(grad_gate_up + at, dg);
  StorePack(grad_gate_up + at + f, du);
}

// The element strides of a [batch, heads, seq, dim] tensor whose dim is contiguous.
struct RopeStrides {
  int64_t batch = 0, head = 0, seq = 0;
};

// A rotary embedding's shape, the strides of what it reads (forward: x; backward: the output's
// gradient) and of what it writes (forward: its output; backward: x's gradient). The model's q and
// k are views of the merged q/k/v GEMM's output, transposed ([batch, seq, heads, dim] in memory),
// and x's gradient is written in that same layout, so that autograd's way back into the GEMM
// output's columns needs no copy. `pack` elements along dim per call (1, or kPack<T> where dim is
// a multiple of twice it, every stride of it, and the addresses aligned: RopePack). The dividers
// split a flat pack index, in [batch, heads, seq, dim] order, into its coordinates.
struct RopeShape {
  int64_t heads = 0, seq = 0, dim = 0;
  RopeStrides in, out;
  int pack = 1;
  Divider by_dim, by_seq, by_heads;
};

// The dividers for `shape`'s sizes and pack, over `elements` outputs in all (batch * heads * seq
// * dim).
inline RopeShape WithDividers(RopeShape shape, int64_t elements) {
  const int64_t packs = elements / shape.pack;
  shape.by_dim = Divider(shape.dim / shape.pack, packs);
  shape.by_seq = Divider(shape.seq, packs);
  shape.by_heads = Divider(shape.heads, packs);
  return shape;
}

// The pack width for x (storage bytes x_bytes; read at `in`, written at `out` with `shape`'s
// strides) and the tables (table_bytes each): PackFor over half of dim and every stride.
inline int RopePack(const RopeShape& shape, size_t x_bytes, const void* in, const void* out, size_t table_bytes,
                    const void* cos, const void* sin) {
  return PackFor({shape.dim / 2, shape.in.batch, shape.in.head, shape.in.seq, shape.out.batch, shape.out.head,
                  shape.out.seq},
                 {{in, x_bytes}, {out, x_bytes}, {cos, table_bytes}, {sin, table_bytes}});
}

// Pack v's coordinates: the offsets of its (batch, head, position) row in the input and the
// output, its position t and its first column d.
struct RopeCoordinates {
  int64_t in, out, t, d;
};

template <int N>
MW_HOST_DEVICE RopeCoordinates RopeAt(int64_t v, const RopeShape& s) {
  const int64_t rest = s.by_dim.Div(v);
  const int64_t d = (v - rest * s.by_dim.divisor) * N;
  const int64_t bh = s.by_seq.Div(rest);
  const int64_t t = rest - bh * s.seq;
  const int64_t b = s.by_heads.Div(bh), h = bh - b * s.heads;
  return {b * s.in.batch + h * s.in.head + t * s.in.seq, b * s.out.batch + h * s.out.head + t * s.out.seq, t, d};
}

// Rotary embedding in Hugging Face's rotate_half layout: out = x * cos + rotate_half(x) * sin,
// where rotate_half(x) = [-x[half:], x[:half]]. Pack v (a pack never straddles half: half % N ==
// 0); cos and sin are [>= seq, dim] contiguous tables in Acc. Rounded to T once (the composition
// rounds each product and the sum).
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE void RopeForwardAt(int64_t v, const RopeShape& s, const T* x, const Acc* cos, const Acc* sin,
                                  T* out) {
  const RopeCoordinates at = RopeAt<N>(v, s);
  const T* row = x + at.in;
  const int64_t half = s.dim / 2, d = at.d;
  const bool first = d < half;
  const Pack<T, N> xs = LoadPack<N>(row + d);
  const Pack<T, N> partner = LoadPack<N>(row + (first ? d + half : d - half));
  const Pack<Acc, N> c = LoadPack<N>(cos + at.t * s.dim + d), sn = LoadPack<N>(sin + at.t * s.dim + d);
  Pack<T, N> o;
  MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const Acc p = first ? -static_cast<Acc>(partner.v[k]) : static_cast<Acc>(partner.v[k]);
    o.v[k] = static_cast<T>(static_cast<Acc>(xs.v[k]) * c.v[k] + p * sn.v[k]);
  }
  StorePackWide(out + at.out + d, o);
}

// Its backward: the transpose of the same linear map, from grad_out (read at `in`) into grad_x
// (written at `out`): grad_x[d] = g[d] * cos[d] + (d < half ? g[d + half] * sin[d + half] :
// -g[d - half] * sin[d - half]).
template <typename T, typename Acc, int N = 1>
MW_HOST_DEVICE void RopeBackwardAt(int64_t v, const RopeShape& s, const T* grad_out, const Acc* cos,
                                   const Acc* sin, T* grad_x) {
  const RopeCoordinates at = RopeAt<N>(v, s);
  const T* row = grad_out + at.in;
  const int64_t half = s.dim / 2, d = at.d;
  const bool first = d < half;
  const int64_t table = at.t * s.dim;
  const int64_t p = first ? d + half : d - half;
  const Pack<T, N> g = LoadPack<N>(row + d), gp = LoadPack<N>(row + p);
  const Pack<Acc, N> c = LoadPack<N>(cos + table + d), sp = LoadPack<N>(sin + table + p);
  Pack<T, N> o;
  MW_UNROLL
  for (int k = 0; k < N; ++k) {
    const Acc rotated = static_cast<Acc>(gp.v[k]) * sp.v[k];
    o.v[k] = static_cast<T>(static_cast<Acc>(g.v[k]) * c.v[k] + (first ? rotated : -rotated));
  }
  StorePackWide(grad_x + at.out + d, o);
}

}  // namespace meshwork::model::fused
