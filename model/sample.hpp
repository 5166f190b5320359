// Drawing the next token from logits, deterministically from an rng::Stream.
#pragma once

#include <cstdint>

#include "core/rng.hpp"

namespace troupe::model {

// logits(V). temperature <= 0 picks the argmax (lowest index on ties); otherwise samples
// from softmax(logits / temperature) restricted to the top_k largest (top_k <= 0: all).
// Consumes exactly one uniform from `stream` when sampling.
int32_t sample_token(const float* logits, int V, float temperature, int top_k, rng::Stream& stream);

}  // namespace troupe::model
