// A four-module model for golden tests: embed, two layers with parameters of uneven sizes,
// head. Bytes and seconds are small round numbers so expected figures can be worked by hand.
#pragma once

#include <string>

inline const std::string kSmallModel = R"(meshwork-ir 1
mesh dp_shard=2 dp_replicate=1
param 0 model.embed_tokens.weight gathered=4000 grad=8000 shard=4000
param 1 model.layers.0.w gathered=3000 grad=6000 shard=3000
param 2 model.layers.0.v gathered=1000 grad=2000 shard=1000
param 3 model.layers.1.w gathered=3000 grad=6000 shard=3000
param 4 model.layers.1.v gathered=1000 grad=2000 shard=1000
param 5 lm_head.weight gathered=4000 grad=8000 shard=4000
module embed fwd=0.001 bwd=0.002 act=100 params=[0]
module layers.0 fwd=0.01 bwd=0.02 act=5000 params=[1,2]
module layers.1 fwd=0.01 bwd=0.02 act=5000 params=[3,4]
module head fwd=0.002 bwd=0.004 act=800 params=[5]
)";
