#include <catch2/catch.hpp>

#include "comm/error.hpp"
#include "core/error.hpp"
#include "parallel/grid.hpp"
#include "parallel/pipeline.hpp"
#include "plan/partition.hpp"

using namespace troupe;
using namespace troupe::parallel;
using namespace troupe::plan;

TEST_CASE("grid: pipeline places of the worked 2x2x2 example", "[parallel][grid]") {
  struct Row {
    int rank, stage, prev, next;
    std::vector<int> group;
  };
  const Row rows[] = {{0, 0, -1, 2, {0, 2}}, {1, 0, -1, 3, {1, 3}}, {2, 1, 0, -1, {0, 2}},
                      {3, 1, 1, -1, {1, 3}}, {4, 0, -1, 6, {4, 6}}, {5, 0, -1, 7, {5, 7}},
                      {6, 1, 4, -1, {4, 6}}, {7, 1, 5, -1, {5, 7}}};
  for (const Row& r : rows) {
    INFO("rank " << r.rank);
    PipelinePlace s = pipeline_place(r.rank, 2, 2, 2);
    REQUIRE(s.stage == r.stage);
    REQUIRE(s.prev == r.prev);
    REQUIRE(s.next == r.next);
    REQUIRE(s.pipeline_group == r.group);
    REQUIRE(s.embedding_group == r.group);
    REQUIRE(s.first == (r.stage == 0));
    REQUIRE(s.last == (r.stage == 1));
    REQUIRE(s.coord.d == r.rank / 4);
  }
  // wrapped neighbours of a 4-stage pipeline (interleaved chunks flow p=3 -> p=0)
  PipelinePlace s = pipeline_place(3, 1, 4, 1);
  REQUIRE(s.next == -1);
  REQUIRE(s.next_wrapped == 0);
  REQUIRE(pipeline_place(0, 1, 4, 1).prev_wrapped == 3);
  REQUIRE(s.embedding_group == std::vector<int>{0, 3});
  REQUIRE(pipeline_place(0, 1, 1, 1).embedding_group == std::vector<int>{0});
  REQUIRE(embedding_group_in_pipeline(4) == std::vector<int>{0, 3});
  REQUIRE_THROWS_AS(pipeline_place(8, 2, 2, 2), comm::CommError);
}

TEST_CASE("partition: contiguous, every stage has a block, head and embedding counted",
          "[parallel][partition]") {
  model::ModelConfig gpt2;
  gpt2.vocab_size = 50257;
  gpt2.d_model = 768;
  gpt2.seq_len = 1024;
  gpt2.n_layer = 12;
  gpt2.n_head = 12;
  StageCosts c = stage_costs(shape_of(gpt2));
  REQUIRE(c.head == Approx(4.93).margin(0.01));  // the V x D GEMM of GPT-2 small ~ 5 blocks
  REQUIRE(c.embedding < 0.01);

  for (int L : {1, 2, 5, 8, 12, 13, 24, 48})
    for (int pp = 1; pp <= 8; ++pp)
      for (int v = 1; v <= 3; ++v) {
        INFO("L " << L << " pp " << pp << " v " << v);
        if (L < pp * v) {
          REQUIRE_THROWS_WITH(partition_layers(L, pp, v, stage_costs(shape_of(gpt2))),
                              Catch::Contains("cannot give each"));
          continue;
        }
        Partition p = partition_layers(L, pp, v, stage_costs(shape_of(gpt2)));
        REQUIRE(p.n_chunks() == pp * v);
        int next = 0;
        for (int k = 0; k < p.n_chunks(); ++k) {
          REQUIRE(p.chunks[k].first == next);
          REQUIRE(p.chunks[k].n_blocks() >= 1);
          REQUIRE(p.chunks[k].has_embedding == (k == 0));
          REQUIRE(p.chunks[k].has_head == (k == p.n_chunks() - 1));
          next = p.chunks[k].last;
        }
        REQUIRE(next == L);
        // deterministic
        Partition q = partition_layers(L, pp, v, stage_costs(shape_of(gpt2)));
        for (int k = 0; k < p.n_chunks(); ++k) REQUIRE(q.chunks[k].last == p.chunks[k].last);
        // optimal against the even split when it exists
        if (L % (pp * v) == 0) REQUIRE(p.max_cost() <= L / (pp * v) + c.head + c.embedding + 1e-9);
      }
  // GPT-2 small on 4 stages: the head (~4.9 blocks) leaves the last stage one block,
  // and the other 11 spread evenly (the embedding tips the first stage to 3).
  Partition p = partition_layers(12, 4, 1, stage_costs(shape_of(gpt2)));
  std::vector<int> sizes;
  for (auto& r : p.chunks) sizes.push_back(r.n_blocks());
  REQUIRE(sizes == std::vector<int>{3, 4, 4, 1});
  REQUIRE(p.max_cost() == Approx(1.0 + c.head));
  // a cheap head: an even split
  Partition e = partition_layers(8, 4, 1, StageCosts{1.0, 0.1, 0.5});
  for (auto& r : e.chunks) REQUIRE(r.n_blocks() == 2);
  // interleaved: rank p's chunk c is model chunk c * pp + p
  Partition iv = partition_layers(8, 2, 2, StageCosts{1.0, 0.0, 0.0});
  REQUIRE(iv.of(1, 0).first == 2);
  REQUIRE(iv.of(0, 1).first == 4);
  REQUIRE(iv.of(1, 1).has_head);
  // ties go to earlier chunks
  Partition t = partition_layers(5, 2, 1, StageCosts{1.0, 0.0, 0.0});
  REQUIRE(t.chunks[0].n_blocks() == 3);
  REQUIRE_THROWS_AS(partition_layers(4, 0, 1, stage_costs(shape_of(gpt2))), Error);
}
