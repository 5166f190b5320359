#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/safetensors.hpp"

namespace fs = std::filesystem;
namespace st = troupe::safetensors;
using troupe::DType;
using troupe::Tensor;

namespace {

fs::path scratch_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("troupe-st-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes a file with a hand-made header (length prefix computed here) and `data_bytes` zero bytes.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::vector<char> bytes(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0);
  spit(p, bytes);
}

struct Sample {
  Tensor a = Tensor::empty({3, 4});
  Tensor b = Tensor::empty({5}, DType::i32);
  Tensor c = Tensor::empty({2, 2}, DType::bf16);
  Sample() {
    for (int i = 0; i < 12; ++i) a.f32()[i] = 0.5f * static_cast<float>(i) - 1.0f;
    for (int i = 0; i < 5; ++i) b.i32()[i] = -7 + 1000 * i;
    // bf16 of 1.0, -2.0, 0.5, 3.0
    uint16_t bits[4] = {0x3f80, 0xc000, 0x3f00, 0x4040};
    std::memcpy(c.data(), bits, sizeof bits);
  }
  std::vector<st::WriteEntry> entries() const {
    return {st::entry("layer.a", a), st::entry("b", b), st::entry("c.bf16", c)};
  }
};

}  // namespace

TEST_CASE("safetensors: round trip, metadata, row and byte ranges", "[safetensors]") {
  fs::path dir = scratch_dir("rt");
  Sample s;
  st::Metadata meta{{"format", "pt"}, {"step", "500"}};
  uint64_t size = st::write((dir / "x.safetensors").string(), s.entries(), meta, {true});
  REQUIRE(size == fs::file_size(dir / "x.safetensors"));

  st::Reader r((dir / "x.safetensors").string());
  REQUIRE(r.metadata() == meta);
  REQUIRE(r.names() == std::vector<std::string>{"layer.a", "b", "c.bf16"});
  REQUIRE((r.data_start() - 8) % 8 == 0);
  REQUIRE(r.info("b").dtype == DType::i32);
  Tensor a = r.read("layer.a");
  REQUIRE(a.shape() == troupe::Shape{3, 4});
  REQUIRE(std::memcmp(a.data(), s.a.data(), s.a.nbytes()) == 0);
  Tensor rows = r.read_rows("layer.a", 1, 3);
  REQUIRE(rows.shape() == troupe::Shape{2, 4});
  REQUIRE(rows.f32()[0] == s.a.f32()[4]);
  REQUIRE(rows.f32()[7] == s.a.f32()[11]);
  int32_t mid[2];
  r.read_bytes("b", 8, 8, mid);
  REQUIRE(mid[0] == s.b.i32()[2]);
  REQUIRE(mid[1] == s.b.i32()[3]);
  REQUIRE_THROWS_AS(r.read_bytes("b", 16, 8, mid), troupe::Error);
  REQUIRE_THROWS_AS(r.read("nope"), troupe::Error);
  REQUIRE(std::memcmp(r.read("c.bf16").data(), s.c.data(), 8) == 0);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: header is space padded to 8 bytes and offsets tile the buffer", "[safetensors]") {
  fs::path dir = scratch_dir("pad");
  Tensor one = Tensor::zeros({1}, DType::u8);
  Tensor big = Tensor::zeros({3}, DType::i64);
  st::write((dir / "p.safetensors").string(), {st::entry("u", one), st::entry("v", big)});
  std::vector<char> bytes = slurp(dir / "p.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  REQUIRE(n % 8 == 0);
  REQUIRE(bytes.size() == 8 + n + 1 + 24);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  REQUIRE(header.front() == '{');
  size_t close = header.rfind('}');
  for (size_t i = close + 1; i < header.size(); ++i) REQUIRE(header[i] == ' ');
  st::Reader r((dir / "p.safetensors").string());
  REQUIRE(r.info("u").begin == 0);
  REQUIRE(r.info("v").begin == 1);
  REQUIRE(r.info("v").end == 25);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: truncated and corrupt files give clear errors", "[safetensors]") {
  fs::path dir = scratch_dir("bad");
  Sample s;
  fs::path good = dir / "good.safetensors";
  st::write(good.string(), s.entries());
  std::vector<char> bytes = slurp(good);

  auto expect_error = [&](const fs::path& p, const std::string& fragment) {
    try {
      st::Reader r(p.string());
      FAIL("no error for " << p.filename());
    } catch (const st::FormatError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(fragment) != std::string::npos);
      REQUIRE(std::string(e.what()).find(p.filename().string()) != std::string::npos);
    }
  };

  spit(dir / "short.safetensors", std::vector<char>(bytes.begin(), bytes.begin() + 5));
  expect_error(dir / "short.safetensors", "no header length");
  spit(dir / "cut_header.safetensors", std::vector<char>(bytes.begin(), bytes.begin() + 20));
  expect_error(dir / "cut_header.safetensors", "truncated");
  spit(dir / "cut_data.safetensors", std::vector<char>(bytes.begin(), bytes.end() - 3));
  expect_error(dir / "cut_data.safetensors", "truncated");
  std::vector<char> extra = bytes;
  extra.push_back(0);
  spit(dir / "extra.safetensors", extra);
  expect_error(dir / "extra.safetensors", "trailing");
  std::vector<char> huge = bytes;
  huge[7] = 0x7f;
  spit(dir / "huge.safetensors", huge);
  expect_error(dir / "huge.safetensors", "implausible");

  write_raw(dir / "json.safetensors", "{\"a\": [1, 2", 0);
  expect_error(dir / "json.safetensors", "not valid JSON");
  write_raw(
      dir / "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  expect_error(dir / "overlap.safetensors", "overlaps");
  write_raw(dir / "hole.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  expect_error(dir / "hole.safetensors", "hole");
  write_raw(dir / "size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  expect_error(dir / "size.safetensors", "bytes for F32");
  write_raw(dir / "dtype.safetensors", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1);
  expect_error(dir / "dtype.safetensors", "unsupported safetensors dtype");
  write_raw(dir / "meta.safetensors", R"({"__metadata__":{"k":3}})", 0);
  expect_error(dir / "meta.safetensors", "not a string");
  write_raw(dir / "fields.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", 4);
  expect_error(dir / "fields.safetensors", "lacks");
  fs::remove_all(dir);
}

TEST_CASE("safetensors: files agree with an independent Python reader and writer", "[safetensors]") {
  // The script needs only the standard library; Debian's interpreter is preferred when present.
  std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  fs::path dir = scratch_dir("py");
  Sample s;
  st::write((dir / "cpp.safetensors").string(), s.entries(), {{"who", "troupe"}});
  // The script reads our file with json + struct only, checks every value (bf16 widened
  // to f32 by hand), and writes its own file for us to read back.
  const char* script = R"PY(
import json, struct, sys
d = sys.argv[1]
raw = open(d + '/cpp.safetensors', 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
assert n % 8 == 0, n
h = json.loads(raw[8:8 + n].decode('utf-8'))
buf = raw[8 + n:]
assert h['__metadata__'] == {'who': 'troupe'}, h
def get(name, fmt):
    e = h[name]; b, e2 = e['data_offsets']
    count = 1
    for s in e['shape']: count *= s
    assert e2 - b == count * struct.calcsize('<' + fmt), e
    return list(struct.unpack('<%d%s' % (count, fmt), buf[b:e2]))
assert h['layer.a']['dtype'] == 'F32' and h['layer.a']['shape'] == [3, 4]
assert h['b']['dtype'] == 'I32' and h['c.bf16']['dtype'] == 'BF16'
assert get('layer.a', 'f') == [0.5 * i - 1 for i in range(12)]
assert get('b', 'i') == [-7 + 1000 * i for i in range(5)]
bf = [struct.unpack('<f', struct.pack('<I', x << 16))[0] for x in get('c.bf16', 'H')]
assert bf == [1.0, -2.0, 0.5, 3.0], bf
x = struct.pack('<6f', *[1.5 * i for i in range(6)])
y = struct.pack('<3q', 10, -20, 30)
hdr = {'x': {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [0, 24]},
       'y': {'dtype': 'I64', 'shape': [3], 'data_offsets': [24, 48]},
       '__metadata__': {'from': 'python'}}
s = json.dumps(hdr).encode()
s += b' ' * ((8 - len(s) % 8) % 8)
open(d + '/py.safetensors', 'wb').write(struct.pack('<Q', len(s)) + s + x + y)
)PY";
  { std::ofstream(dir / "check.py") << script; }
  std::string cmd = python + " " + (dir / "check.py").string() + " " + dir.string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  st::Reader r((dir / "py.safetensors").string());
  REQUIRE(r.metadata().at("from") == "python");
  Tensor x = r.read("x");
  REQUIRE(x.shape() == troupe::Shape{2, 3});
  for (int i = 0; i < 6; ++i) REQUIRE(x.f32()[i] == 1.5f * static_cast<float>(i));
  Tensor y = r.read("y");
  REQUIRE(y.dtype() == DType::i64);
  REQUIRE(y.data_as<int64_t>()[1] == -20);
  fs::remove_all(dir);
}
