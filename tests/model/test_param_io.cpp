#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "model/param_io.hpp"
#include "model/stage.hpp"

using namespace troupe;
using namespace troupe::model;
namespace fs = std::filesystem;

TEST_CASE("param io: save, then load whole parameters and slices along either dim", "[model][io]") {
  fs::path dir = fs::temp_directory_path() / ("troupe-pio-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ModelConfig c;
  c.d_model = 16;
  c.seq_len = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.seed = 3;
  Stage a(c, LayerRange::full(c.n_layer));
  const std::string path = (dir / "model.safetensors").string();
  save_params(path, a.params(), {{"step", "0"}});

  ModelConfig c2 = c;
  c2.seed = 4;  // different init, overwritten by the load
  Stage b(c2, LayerRange::full(c2.n_layer));
  safetensors::Reader file(path);
  load_params(file, b.params());
  for (auto& p : a.params()) {
    INFO(p.name);
    REQUIRE(std::memcmp(p.data.data(), b.param(p.name).data.data(), p.data.nbytes()) == 0);
  }

  // A shard holding columns [4, 12) of c_fc.weight (64, 16) and rows [16, 48) of it.
  const Param& full = a.param("h.1.mlp.c_fc.weight");
  for (int dim : {0, 1}) {
    Param shard;
    shard.name = full.name;
    shard.global_shape = full.global_shape;
    shard.split_dim = dim;
    shard.offset = dim == 0 ? 16 : 4;
    Shape local = full.global_shape;
    local[static_cast<size_t>(dim)] = dim == 0 ? 32 : 8;
    shard.data = Tensor::zeros(local);
    load_param(file, shard);
    for (int64_t i = 0; i < local[0]; ++i)
      for (int64_t j = 0; j < local[1]; ++j) {
        int64_t gi = dim == 0 ? i + 16 : i, gj = dim == 1 ? j + 4 : j;
        REQUIRE(shard.data.f32()[i * local[1] + j] == full.data.f32()[gi * 16 + gj]);
      }
    // The slice loaded from the file equals the slice initialised on its own.
    ParamSpec spec;
    for (auto& s : param_specs(c, LayerRange::full(c.n_layer)))
      if (s.name == full.name) spec = s;
    spec.split_dim = dim;
    spec.offset = shard.offset;
    spec.local = local[static_cast<size_t>(dim)];
    Tensor init = Tensor::zeros(local);
    init_param(init.f32(), spec, c.seed);
    REQUIRE(std::memcmp(init.data(), shard.data.data(), init.nbytes()) == 0);
  }

  ModelConfig wider = c;
  wider.d_model = 32;
  Stage w(wider, LayerRange::full(wider.n_layer));
  REQUIRE_THROWS_AS(load_params(file, w.params()), troupe::Error);
  fs::remove_all(dir);
}
