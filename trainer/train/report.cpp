// The training loop's reporting (see report.h): metrics, logging.jsonl, the progress line and
// the closing summary, in the formats docs/config.md and docs/metrics.md describe.
#include "trainer/train/report.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/units.h"

namespace meshwork::train {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Whole seconds first, so that 119.6 s is "2m00s", never "1m60s".
std::string Duration(double s) {
  const int64_t t = std::llround(std::max(0.0, s));
  char buf[32];
  if (t < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  } else if (t < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  }
  return buf;
}

Result<std::unique_ptr<ProgressReport>> ProgressReport::Create(Run run, const std::string& jsonl_path,
                                                               metrics::TrainerMetrics& metrics, std::ostream& out,
                                                               TrainSummary& summary) {
  std::unique_ptr<std::ofstream> jsonl;
  if (!jsonl_path.empty()) {
    jsonl = std::make_unique<std::ofstream>(jsonl_path, std::ios::app);
    if (!*jsonl) return IOError("key 'logging.jsonl': cannot open '" + jsonl_path + "' for appending");
  }
  return std::unique_ptr<ProgressReport>(new ProgressReport(run, jsonl_path, std::move(jsonl), metrics, out, summary));
}

void ProgressReport::Start() { start_ = Clock::now(); }

Status ProgressReport::Step(const StepRecord& r) {
  const int64_t step = r.step;
  if (step == run_.first_step) after_first_ = Clock::now();
  summary_.losses.push_back(r.loss);
  const double tps = static_cast<double>(run_.tokens_per_step) / r.seconds;  // global
  const double mfu = tps / static_cast<double>(run_.world_size) * run_.flops_per_token / run_.peak_flops;

  // Metrics every step: communication since the last step, throughput per rank (sum by job
  // gives the job's; the log shows the global one), memory.
  summary_.exposed_comm_seconds += r.comm.exposed_comm_seconds;
  std::map<std::string, double> sent;
  for (int i = 0; i < dist::kNumCollectives; ++i) {
    sent[dist::CollectiveName(static_cast<dist::Collective>(i))] =
        static_cast<double>(r.comm.comm.bytes_sent[i] - summary_.comm.bytes_sent[i]);
  }
  metrics_.RecordCommunication(r.comm.exposed_comm_seconds, sent);
  summary_.comm = r.comm.comm;
  summary_.peak_memory_bytes = std::max(summary_.peak_memory_bytes, r.memory.peak_bytes);
  summary_.steady_from_step = run_.steady_from_step;
  if (step >= run_.steady_from_step) {
    summary_.steady_peak_tensor_bytes = std::max(summary_.steady_peak_tensor_bytes, r.memory.tensors.peak);
  }
  if (step >= run_.steady_from_step && !r.comm.pipeline_seconds.empty()) {
    summary_.pipeline_busy_seconds.resize(r.comm.pipeline_busy_seconds.size());
    summary_.pipeline_seconds.resize(r.comm.pipeline_seconds.size());
    for (size_t i = 0; i < r.comm.pipeline_seconds.size(); ++i) {
      summary_.pipeline_busy_seconds[i] += r.comm.pipeline_busy_seconds[i];
      summary_.pipeline_seconds[i] += r.comm.pipeline_seconds[i];
    }
  }
  summary_.memory_device = r.memory.device;
  summary_.cuda_reserved_peak_bytes = std::max(summary_.cuda_reserved_peak_bytes, r.memory.reserved_peak_bytes);
  summary_.cuda_alloc_retries = r.memory.alloc_retries;
  const double rank_tokens = static_cast<double>(run_.tokens_per_step) / static_cast<double>(run_.world_size);
  metrics_.RecordStep({step + 1, r.loss, r.seconds, rank_tokens, rank_tokens / r.seconds, mfu, r.lr, r.grad_norm});
  if (jsonl_) {
    *jsonl_ << "{\"step\":" << step + 1 << ",\"loss\":" << Format("%.17g", r.loss) << ",\"lr\":"
            << Format("%.17g", r.lr) << ",\"grad_norm\":" << Format("%.17g", r.grad_norm)
            << ",\"tokens_per_second\":" << Format("%.1f", tps) << ",\"step_seconds\":"
            << Format("%.6f", r.seconds) << ",\"exposed_comm_seconds\":"
            << Format("%.6f", r.comm.exposed_comm_seconds) << ",\"peak_tensor_bytes\":" << r.memory.tensors.peak;
    if (!r.comm.pipeline_seconds.empty()) {
      auto list = [&](const std::vector<double>& v) {
        std::string text;
        for (double x : v) text += (text.empty() ? "" : ",") + Format("%.6f", x);
        return "[" + text + "]";
      };
      *jsonl_ << ",\"pipeline_busy_seconds\":" << list(r.comm.pipeline_busy_seconds)
              << ",\"pipeline_seconds\":" << list(r.comm.pipeline_seconds);
    }
    if (r.comm.pipeline_overlapped_reduce_scatters >= 0) {
      *jsonl_ << ",\"pipeline_overlapped_reduce_scatters\":" << r.comm.pipeline_overlapped_reduce_scatters;
    }
    *jsonl_ << "}\n";
    jsonl_->flush();
    if (!*jsonl_) {
      return IOError("key 'logging.jsonl': writing step " + std::to_string(step + 1) + " to '" + jsonl_path_ +
                     "' failed: " + std::strerror(errno) + " (a full disk?)");
    }
  }
  metrics_.RecordMemory(r.memory.current_bytes, r.memory.peak_bytes, r.memory.limit_bytes, r.memory.device);

  // A log line every logging.every steps, and at the first and last.
  const bool last = step + 1 == run_.total_steps;
  if ((step + 1) % run_.log_every == 0 || last || step == run_.first_step) {
    const double eta = Seconds(start_) / static_cast<double>(step + 1 - run_.first_step) *
                       static_cast<double>(run_.total_steps - step - 1);
    out_ << "step " << step + 1 << "/" << run_.total_steps << " | loss " << Format("%.4f", r.loss)
         << " | lr " << Format("%.2e", r.lr) << " | grad_norm " << Format("%.3f", r.grad_norm) << " | "
         << Format("%.0f", tps) << " tok/s | step " << Format("%.1f", r.seconds * 1e3) << " ms | mfu "
         << Format("%.2f", mfu * 100) << "% | mem " << Mib(r.memory.current_bytes) << " (peak "
         << Mib(r.memory.peak_bytes) << ", " << r.memory.device << ") | eta " << Duration(eta) << "\n";
    out_.flush();
  }
  return Status::Ok();
}

void ProgressReport::Finish() {
  summary_.steps = std::max<int64_t>(0, run_.total_steps - run_.first_step);
  summary_.tokens = run_.tokens_per_step * summary_.steps;
  summary_.seconds = Seconds(start_);
  // The first step pays one-off costs (allocator growth, thread pools); leave it out of the
  // throughput figure when there is anything else to measure.
  const int64_t timed_steps = summary_.steps > 1 ? summary_.steps - 1 : summary_.steps;
  const double timed_s = summary_.steps > 1 ? Seconds(after_first_) : summary_.seconds;
  summary_.tokens_per_second =
      timed_steps > 0 ? static_cast<double>(run_.tokens_per_step * timed_steps) / timed_s : 0;
  summary_.mean_mfu = summary_.tokens_per_second / static_cast<double>(run_.world_size) * run_.flops_per_token /
                      run_.peak_flops;
}

void ProgressReport::PrintSummary(bool has_eval) const {
  const TrainSummary& s = summary_;
  if (run_.world_size > 1) {
    out_ << "communication (rank 0):";
    for (int i = 0; i < dist::kNumCollectives; ++i) {
      if (s.comm.calls[i] == 0) continue;
      out_ << " " << dist::CollectiveName(static_cast<dist::Collective>(i)) << " " << s.comm.calls[i] << " calls "
           << Mib(s.comm.bytes_sent[i]) << " sent;";
    }
    out_ << " exposed " << Format("%.2f", s.exposed_comm_seconds) << " s ("
         << Format("%.1f", 100 * s.exposed_comm_seconds / s.seconds) << "% of the run)\n";
  }
  if (!s.pipeline_seconds.empty()) {
    out_ << "pipeline bubble (each rank's idle share of its program, steps " << s.steady_from_step + 1 << "-"
         << run_.total_steps << "):";
    for (size_t r = 0; r < s.pipeline_seconds.size(); ++r) {
      const double idle = s.pipeline_seconds[r] > 0 ? 1 - s.pipeline_busy_seconds[r] / s.pipeline_seconds[r] : 0;
      out_ << (r ? "," : "") << " rank " << r << " " << Format("%.1f", 100 * idle) << "%";
    }
    out_ << "\n";
  }
  out_ << "done: " << s.steps << " steps";
  if (run_.first_step > 0) out_ << " (resumed at step " << run_.first_step << ")";
  out_ << ", " << s.tokens << " tokens in " << Format("%.1f", s.seconds) << " s | final loss "
       << (s.losses.empty() ? std::string("n/a") : Format("%.4f", s.losses.back())) << " | "
       << Format("%.0f", s.tokens_per_second) << " tok/s | mfu " << Format("%.2f", s.mean_mfu * 100)
       << "% | peak mem " << Mib(s.peak_memory_bytes) << " (" << s.memory_device << ")";
  if (s.steady_peak_tensor_bytes > 0) {
    out_ << " | step peak tensors " << Mib(s.steady_peak_tensor_bytes) << " (from step " << s.steady_from_step + 1
         << ")";
  }
  if (s.memory_device == "cuda") {
    out_ << " | reserved peak " << Mib(s.cuda_reserved_peak_bytes) << ", allocator retries " << s.cuda_alloc_retries;
  }
  if (has_eval && s.initial_eval_loss >= 0) {
    out_ << " | eval loss " << SixDigits(s.initial_eval_loss) << " -> " << SixDigits(s.final_eval_loss);
  } else if (has_eval) {
    out_ << " | eval loss " << SixDigits(s.final_eval_loss);
  }
  out_ << "\n";
}

}  // namespace meshwork::train
