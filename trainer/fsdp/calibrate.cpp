// Link, copy and interference measurements for compiled FSDP's cost model (see calibrate.h).
#include "trainer/fsdp/calibrate.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace meshwork::fsdp {

Result<compiler::LinkCost> CalibrateLink(dist::Communicator& group, dist::Collective kind,
                                         const std::vector<int64_t>& sizes, int reps) {
  std::vector<std::pair<int64_t, double>> samples;
  const int n = group.size();
  const auto on_group = torch::TensorOptions().device(group.device());
  for (int64_t bytes : sizes) {
    const int64_t per_rank = std::max<int64_t>(1, bytes / 4 / n);  // fp32 elements of one rank's part
    torch::Tensor part = torch::ones({per_rank}, on_group);
    torch::Tensor whole = torch::ones({per_rank * n}, on_group);
    for (int rep = 0; rep <= reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      Result<std::unique_ptr<dist::Work>> work = Internal("no collective");
      switch (kind) {
        case dist::Collective::kAllGather: work = group.AllGatherInto(whole, part); break;
        case dist::Collective::kReduceScatter: work = group.ReduceScatter(part, whole, dist::ReduceOp::kSum); break;
        case dist::Collective::kAllReduce: work = group.AllReduce(whole, dist::ReduceOp::kSum); break;
        default: return Internal(std::string("CalibrateLink: cannot time ") + dist::CollectiveName(kind));
      }
      MW_RETURN_IF_ERROR(work.status());
      MW_RETURN_IF_ERROR((*work)->Synchronize());
      const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) samples.push_back({per_rank * n * 4, (*work)->DeviceSeconds().value_or(host)});
    }
  }
  return compiler::FitLink(samples, n);
}

Result<double> MeasureLaneShare(dist::Communicator& gather, dist::Communicator& reduce, int64_t gather_bytes,
                                int64_t reduce_bytes) {
  const int n = gather.size();
  if (reduce.size() != n) return Internal("MeasureLaneShare: the two lanes span different groups");
  const auto on_group = torch::TensorOptions().device(gather.device());
  const int64_t gather_part = std::max<int64_t>(1, gather_bytes / 4 / n);
  const int64_t reduce_part = std::max<int64_t>(1, reduce_bytes / 4 / n);
  torch::Tensor gather_in = torch::ones({gather_part}, on_group), gather_out = torch::empty({gather_part * n}, on_group);
  torch::Tensor reduce_in = torch::ones({reduce_part * n}, on_group), reduce_out = torch::empty({reduce_part}, on_group);
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Times the all-gather, the reduce-scatter or both, from a barrier to the last one's end.
  auto timed = [&](bool with_gather, bool with_reduce) -> Result<double> {
    MW_ASSIGN_OR_RETURN(auto barrier, gather.Barrier());
    MW_RETURN_IF_ERROR(barrier->Wait());
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<dist::Work> g, r;
    if (with_gather) {
      MW_ASSIGN_OR_RETURN(g, gather.AllGatherInto(gather_out, gather_in));
    }
    if (with_reduce) {
      MW_ASSIGN_OR_RETURN(r, reduce.ReduceScatter(reduce_out, reduce_in, dist::ReduceOp::kSum));
    }
    if (g) MW_RETURN_IF_ERROR(g->Synchronize());
    if (r) MW_RETURN_IF_ERROR(r->Synchronize());
    return seconds_since(t0);
  };
  MW_RETURN_IF_ERROR(timed(true, true).status());  // warm-up
  std::vector<double> shares;
  for (int rep = 0; rep < 3; ++rep) {
    MW_ASSIGN_OR_RETURN(const double alone_gather, timed(true, false));
    MW_ASSIGN_OR_RETURN(const double alone_reduce, timed(false, true));
    MW_ASSIGN_OR_RETURN(const double together, timed(true, true));
    const double shorter = std::min(alone_gather, alone_reduce), longer = std::max(alone_gather, alone_reduce);
    const double shared_span = together - (longer - shorter);  // shorter / s
    shares.push_back(shared_span <= shorter ? 1.0 : std::clamp(shorter / shared_span, 0.1, 1.0));
  }
  std::sort(shares.begin(), shares.end());
  return shares[shares.size() / 2];
}

double MeasureCopyRate() {
  torch::Tensor src = torch::ones({int64_t{4} << 20});
  torch::Tensor dst = torch::empty_like(src);
  std::vector<double> rates;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    dst.copy_(src);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) rates.push_back(static_cast<double>(dist::TensorBytes(src)) / std::max(s, 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

Result<Interference> MeasureInterference(dist::Communicator& group) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({384, 384});
  auto matmuls = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor c;
    for (int i = 0; i < 32; ++i) c = a.mm(a);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  const int n = group.size();
  const int64_t per_rank = (int64_t{2} << 20) / 4 / n;
  std::vector<torch::Tensor> ins, outs;  // scratch, reused round-robin
  const auto on_group = torch::TensorOptions().device(group.device());
  for (int b = 0; b < 4; ++b) {
    ins.push_back(torch::ones({per_rank}, on_group));
    outs.push_back(torch::empty({per_rank * n}, on_group));
  }
  // From a barrier, 16 all-gathers issued, `during(works)` run on the host, and the span from
  // their issue to the last one's completion.
  using Works = std::vector<std::unique_ptr<dist::Work>>;
  auto gathers = [&](const std::function<void(const Works&)>& during) -> Result<double> {
    MW_ASSIGN_OR_RETURN(auto barrier, group.Barrier());
    MW_RETURN_IF_ERROR(barrier->Wait());
    Works works;
    const double t0 = now();
    for (int i = 0; i < 16; ++i) {
      MW_ASSIGN_OR_RETURN(auto w, group.AllGatherInto(outs[i % 4], ins[i % 4]));
      works.push_back(std::move(w));
    }
    during(works);
    double end = t0;
    for (auto& w : works) {
      MW_RETURN_IF_ERROR(w->Wait());
      end = std::max(end, w->CompletedAt().value_or(now()));
    }
    return end - t0;
  };
  // Matmuls until the last all-gather has completed (bounded: 600 of them).
  auto compute_until_done = [&](const Works& works) {
    torch::Tensor c;
    for (int round = 0; round < 600 && !works.back()->CompletedAt().has_value(); ++round) c = a.mm(a);
  };
  std::vector<double> ks, comm_ks;
  matmuls();  // warm-up
  for (int rep = 0; rep < 3; ++rep) {
    MW_ASSIGN_OR_RETURN(const double comm_alone, gathers([](const Works&) {}));
    MW_ASSIGN_OR_RETURN(const double comm_shared, gathers(compute_until_done));
    comm_ks.push_back(std::clamp(comm_shared / std::max(comm_alone, 1e-9) - 1, 0.0, 9.0));
    MW_ASSIGN_OR_RETURN(auto barrier, group.Barrier());
    MW_RETURN_IF_ERROR(barrier->Wait());
    const double alone = matmuls();
    double shared = 0;
    MW_ASSIGN_OR_RETURN(const double comm, gathers([&](const Works&) { shared = matmuls(); }));
    double k;
    if (comm >= shared) {
      k = shared / alone - 1;  // the matmuls ran under communication the whole time
    } else {
      // For `comm` seconds both ran at 1 / (1 + k): shared - alone = comm * k / (1 + k).
      const double x = std::clamp((shared - alone) / std::max(comm, 1e-9), 0.0, 0.9);
      k = x / (1 - x);
    }
    ks.push_back(std::clamp(k, 0.0, 9.0));
  }
  std::sort(ks.begin(), ks.end());
  std::sort(comm_ks.begin(), comm_ks.end());
  return Interference{ks[ks.size() / 2], comm_ks[comm_ks.size() / 2]};
}

}  // namespace meshwork::fsdp
