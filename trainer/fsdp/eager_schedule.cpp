#include "trainer/fsdp/eager_schedule.h"

#include <torch/torch.h>

#include <string>

namespace meshwork::fsdp {

torch::Tensor EagerSchedule::Forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
  ShardedState* state = &state_;
  std::vector<std::unique_ptr<Unit>>& units = state->units;
  units[0]->WaitGather();
  StepTrace* trace = &state->trace;
  trace->clock.Restart();
  trace->mark = trace->clock.Now();
  const bool prefetch = state->options.prefetch;
  if (prefetch && units.size() > 1) units[1]->StartGather();
  const bool sync = state->sync;
  const int64_t layers = static_cast<int64_t>(units.size()) - 1;
  torch::Tensor logits = state->model->ForwardWithLayerRunner(  // or the loss, with targets
      tokens, [&](int64_t i, model::DecoderLayerImpl& layer, const torch::Tensor& h, const model::RopeTables& rope) {
        Unit* unit = units[i + 1].get();
        if (i == 0) {
          trace->fwd[0] = {trace->mark, trace->clock.Now()};  // the embedding ran since
          state->TraceCompute("fwd embed", trace->fwd[0].from.host, trace->fwd[0].to.host);
        }
        unit->WaitGather();
        if (prefetch && i + 1 < layers) units[i + 2]->StartGather();
        const ComputeClock::Mark start = trace->clock.Now();
        // Backward reaches the layer's input once the whole layer is done (its weights'
        // gradients are accumulated first: autograd runs AccumulateGrad nodes as soon as they
        // are ready). That is the layer's post-backward (reduce-scatter, free) and the previous
        // layer's pre-backward (wait for its gather, prefetch the one before it).
        if (h.requires_grad()) {
          Unit* prev = i > 0 ? units[i].get() : nullptr;
          Unit* before_prev = prefetch && i > 1 ? units[i - 1].get() : nullptr;
          // One reduce-scatter in flight, as FSDP2: the one the layer after this issued is
          // waited for once this one is issued, so the layers' full gradients do not pile up
          // until the end of backward (that pile-up would be eager's peak).
          Unit* reduced_before = i + 2 < static_cast<int64_t>(units.size()) ? units[i + 2].get() : nullptr;
          h.register_hook([state, unit, prev, before_prev, reduced_before, sync, trace, i](const torch::Tensor&) {
            trace->bwd[i + 1] = {trace->mark, trace->clock.Now()};
            state->TraceCompute("bwd layers." + std::to_string(i), trace->bwd[i + 1].from.host,
                                trace->bwd[i + 1].to.host);
            unit->PostBackward(sync);
            if (reduced_before != nullptr && sync) reduced_before->FinishReduce(state->replicate_group);
            if (prev != nullptr) prev->WaitGather();
            if (before_prev != nullptr) before_prev->StartGather();
            trace->mark = trace->clock.Now();
          });
        }
        torch::Tensor out = RunLayer(layer, h, rope, CheckpointedInEager(state->options, i));
        trace->fwd[i + 1] = {start, trace->clock.Now()};
        state->TraceCompute("fwd layers." + std::to_string(i), start.host, trace->fwd[i + 1].to.host);
        // The last layer is the first one backward needs: it stays gathered, as FSDP2's
        // default keeps the last block (freeing it would only gather it again at once).
        if (state->options.reshard_after_forward && i + 1 < layers) unit->Free();
        if (i + 1 == layers) trace->mark = trace->clock.Now();  // the head's time counts from here
        if (i + 1 == layers && out.requires_grad()) {
          // Pre-backward of the last layer (the others get theirs from the next layer's hook).
          Unit* before = prefetch && i > 0 ? units[i].get() : nullptr;
          out.register_hook([state, unit, before, trace, layers](const torch::Tensor&) {
            // Head forward (with the loss) and head backward ran since the end of Forward.
            const ComputeClock::Mark now = trace->clock.Now();
            state->TraceCompute("fwd+bwd head (with the loss)", trace->mark.host, now.host);
            trace->fwd[layers + 1] = {trace->mark, now, 1.0 / 3};
            trace->bwd[layers + 1] = {trace->mark, now, 2.0 / 3};
            unit->WaitGather();
            if (before != nullptr) before->StartGather();
            trace->mark = trace->clock.Now();
          });
        }
        return out;
      },
      targets, state->embed, state->loss);
  if (layers == 0) trace->mark = trace->clock.Now();
  return logits;
}

void EagerSchedule::FinishBackward() {
  StepTrace& trace = state_.trace;
  trace.bwd[0] = {trace.mark, trace.clock.Now()};  // the embedding's backward
  state_.TraceCompute("bwd embed", trace.bwd[0].from.host, trace.bwd[0].to.host);
  // The root's post-backward (its parameters were used at both ends of the model). A layer
  // whose hook did not run (its output did not reach the loss) is reduced here too, so every
  // rank issues the same collectives.
  std::vector<std::unique_ptr<Unit>>& units = state_.units;
  for (size_t u = 1; u < units.size(); ++u) {
    if (units[u]->PendingGrads()) units[u]->PostBackward(state_.sync);
  }
  units[0]->PostBackward(state_.sync);
  if (!state_.sync) return;
  for (auto& unit : units) unit->FinishReduce(state_.replicate_group);
  for (auto& unit : units) unit->FinishReplicaReduce();
}

}  // namespace meshwork::fsdp
