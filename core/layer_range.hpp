// A model chunk's layers: blocks [first, last) of the model, plus the embedding (the first
// chunk) and/or the head (ln_f + the LM head + the loss; the last chunk). The planner's
// partition is a list of them (plan/partition.hpp), and a model::Stage holds one
// (model/stage.hpp); the whole model is full(n_layers): every block, embedding and head.
#pragma once

namespace troupe {

struct LayerRange {
  int first = 0;
  int last = 0;
  bool has_embedding = true;
  bool has_head = true;

  static LayerRange full(int n_layers) { return {0, n_layers, true, true}; }
  int n_blocks() const { return last - first; }
  bool operator==(const LayerRange& o) const {
    return first == o.first && last == o.last && has_embedding == o.has_embedding && has_head == o.has_head;
  }
};

}  // namespace troupe
