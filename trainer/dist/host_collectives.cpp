// Host values through device collectives: a copy to the group's device, one collective, a copy
// back. The copy back runs on the compute stream, which Wait() has ordered after the collective.
#include "trainer/dist/host_collectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

namespace meshwork::dist {
namespace {

// `host` (a CPU tensor) as a tensor on the group's device.
Result<torch::Tensor> ToGroup(const torch::Tensor& host, const Communicator& group) {
  try {
    return host.to(group.device());
  } catch (const c10::Error& e) {
    return Internal(std::string("copying a host value to ") + group.device().str() + " for group '" +
                    group.group_name() + "' failed: " + e.what_without_backtrace());
  }
}

Result<torch::Tensor> ToHost(const torch::Tensor& t, const Communicator& group) {
  try {
    return t.cpu();
  } catch (const c10::Error& e) {
    return Internal(std::string("copying a collective's result from ") + t.device().str() + " for group '" +
                    group.group_name() + "' failed: " + e.what_without_backtrace());
  }
}

Status Run(Result<std::unique_ptr<Work>> work) {
  MW_RETURN_IF_ERROR(work.status());
  return (*work)->Wait();
}

}  // namespace

Result<std::vector<double>> AllReduceValues(Communicator& group, const std::vector<double>& values, ReduceOp op) {
  if (values.empty()) return std::vector<double>();
  MW_ASSIGN_OR_RETURN(torch::Tensor t,
                      ToGroup(torch::tensor(values, torch::TensorOptions().dtype(torch::kDouble)), group));
  MW_RETURN_IF_ERROR(Run(group.AllReduce(t, op)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host, ToHost(t, group));
  const double* p = host.data_ptr<double>();
  return std::vector<double>(p, p + host.numel());
}

Result<std::vector<double>> MedianAcrossRanks(Communicator& group, const std::vector<double>& values) {
  if (values.empty()) return std::vector<double>();
  const int n = group.size();
  const int64_t k = static_cast<int64_t>(values.size());
  MW_ASSIGN_OR_RETURN(torch::Tensor mine,
                      ToGroup(torch::tensor(values, torch::TensorOptions().dtype(torch::kDouble)), group));
  torch::Tensor all = torch::empty({n * k}, mine.options());
  MW_RETURN_IF_ERROR(Run(group.AllGatherInto(all, mine)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host, ToHost(all, group));
  const double* p = host.data_ptr<double>();
  std::vector<double> out(values.size());
  std::vector<double> column(static_cast<size_t>(n));
  for (int64_t i = 0; i < k; ++i) {
    for (int r = 0; r < n; ++r) column[r] = p[r * k + i];
    std::nth_element(column.begin(), column.begin() + n / 2, column.end());
    out[i] = column[n / 2];
  }
  return out;
}

Result<std::vector<std::string>> AllGatherText(Communicator& group, const std::string& text) {
  const int n = group.size();
  MW_ASSIGN_OR_RETURN(torch::Tensor size, ToGroup(torch::full({1}, static_cast<int64_t>(text.size()), torch::kLong), group));
  torch::Tensor sizes = torch::empty({n}, size.options());
  MW_RETURN_IF_ERROR(Run(group.AllGatherInto(sizes, size)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host_sizes, ToHost(sizes, group));
  const int64_t* lengths = host_sizes.data_ptr<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths, lengths + n));
  torch::Tensor mine_host = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(mine_host.data_ptr(), text.data(), text.size());
  MW_ASSIGN_OR_RETURN(torch::Tensor mine, ToGroup(mine_host, group));
  torch::Tensor all = torch::empty({n * longest}, mine.options());
  MW_RETURN_IF_ERROR(Run(group.AllGatherInto(all, mine)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host_all, ToHost(all, group));
  const char* bytes = static_cast<const char*>(host_all.data_ptr());
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.emplace_back(bytes + r * longest, static_cast<size_t>(lengths[r]));
  return out;
}

Result<std::string> BroadcastText(Communicator& group, const std::string& text, int root) {
  const bool mine = group.rank() == root;
  MW_ASSIGN_OR_RETURN(torch::Tensor size,
                      ToGroup(torch::full({1}, static_cast<int64_t>(mine ? text.size() : 0), torch::kLong), group));
  MW_RETURN_IF_ERROR(Run(group.Broadcast(size, root)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host_size, ToHost(size, group));
  const int64_t length = host_size.data_ptr<int64_t>()[0];
  torch::Tensor bytes_host = torch::zeros({std::max<int64_t>(1, length)}, torch::kUInt8);
  if (mine) std::memcpy(bytes_host.data_ptr(), text.data(), text.size());
  MW_ASSIGN_OR_RETURN(torch::Tensor bytes, ToGroup(bytes_host, group));
  MW_RETURN_IF_ERROR(Run(group.Broadcast(bytes, root)));
  MW_ASSIGN_OR_RETURN(torch::Tensor host_bytes, ToHost(bytes, group));
  return std::string(static_cast<const char*>(host_bytes.data_ptr()), static_cast<size_t>(length));
}

}  // namespace meshwork::dist
