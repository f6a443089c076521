// Checkpoints: safetensors round trips, training checkpoints, atomic writes,
// and refusal of truncated or corrupt files without touching anything.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "model_fixtures.h"
#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/checkpoint.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

bool same(const FlatBuffer& a, const FlatBuffer& b) {
  return a.count() == b.count() && std::memcmp(a.data(), b.data(), a.count() * sizeof(float)) == 0;
}

// A valid file split into its JSON header and data section.
struct Parsed {
  json header;
  std::string data;
};

Parsed parse(const std::string& bytes) {
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

std::string assemble(const json& header, const std::string& data) {
  const std::string text = header.dump();
  const std::uint64_t n = text.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + text + data;
}

TEST_CASE("weights round trip through safetensors with GPT-2 names", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig c = test::tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr), loaded(c, ModelLayout::whole(c), nullptr);
  test::randomize(model, 1);
  save_weights(dir / "w.safetensors", model, 17);
  load_weights(dir / "w.safetensors", loaded);
  CHECK(same(model.params(), loaded.params()));

  const Parsed f = parse(read_bytes(dir / "w.safetensors"));
  CHECK(f.header["__metadata__"]["n_layer"] == "2");
  CHECK(f.header["__metadata__"]["block_size"] == "6");
  CHECK(f.header["__metadata__"]["step"] == "17");
  CHECK(f.header["h.1.mlp.c_fc.weight"]["dtype"] == "F32");
  CHECK(f.header["h.1.mlp.c_fc.weight"]["shape"] == json::array({32, 8}));  // [out, in]
  const ParamView& v = model.table().find("h.1.mlp.c_fc.weight");
  const std::uint64_t begin = f.header["h.1.mlp.c_fc.weight"]["data_offsets"][0];
  CHECK(std::memcmp(f.data.data() + begin, model.params().data() + v.offset, v.count() * 4) == 0);
  CHECK(f.data.size() == model.table().count() * 4);
}

TEST_CASE("a training checkpoint restores weights and AdamW state", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig c = test::tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr), loaded(c, ModelLayout::whole(c), nullptr);
  const Range all{0, model.table().count()};
  AdamW opt(model.table(), all, {}, nullptr), loaded_opt(loaded.table(), all, {}, nullptr);
  test::randomize(model, 2);
  Rng rng(3);
  for (float& x : opt.m().span()) x = static_cast<float>(rng.normal());
  for (float& x : opt.v().span()) x = static_cast<float>(rng.uniform());
  TrainState state{7, json{{"seed", 5}}, "corpus", 123, 456};
  for (std::int64_t step : {5, 6, 7}) {
    state.step = step;
    save_checkpoint(dir.path(), model, opt, state);
  }
  CHECK(read_bytes(dir / "latest") == "step_00000007\n");
  CHECK_FALSE(fs::exists(dir / "step_00000005"));  // keeps the newest two
  CHECK(fs::exists(dir / "step_00000006"));
  const fs::path step_dir = resolve_checkpoint(dir.path());
  CHECK(step_dir == dir / "step_00000007");
  const TrainState got = load_checkpoint(step_dir, loaded, loaded_opt);
  CHECK(got.step == 7);
  CHECK(got.options["seed"] == 5);
  CHECK(got.data_fingerprint == 456);
  CHECK(same(model.params(), loaded.params()));
  CHECK(same(opt.m(), loaded_opt.m()));
  CHECK(same(opt.v(), loaded_opt.v()));
}

struct Corruption {
  const char* what;
  const char* expected_message;
  std::function<std::string(const std::string&)> apply;
};

std::string edit_header(const std::string& bytes, const std::function<void(json&)>& edit) {
  Parsed f = parse(bytes);
  edit(f.header);
  return assemble(f.header, f.data);
}

std::vector<Corruption> corruptions() {
  return {
      {"truncated to 5 bytes", "truncated", [](const std::string& b) { return b.substr(0, 5); }},
      {"truncated data", "out of range", [](const std::string& b) { return b.substr(0, b.size() - 100); }},
      {"huge header length", "runs past the end",
       [](const std::string& b) {
         std::string s = b;
         const std::uint64_t n = 1ULL << 40;
         std::memcpy(s.data(), &n, 8);
         return s;
       }},
      {"bad JSON", "not valid JSON", [](const std::string& b) { std::string s = b; s[8] = 'x'; return s; }},
      {"offsets out of range", "out of range",
       [](const std::string& b) {
         return edit_header(b, [](json& h) { h["ln_f.bias"]["data_offsets"][1] = 1u << 30; });
       }},
      {"offsets not matching the shape", "needs",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["ln_f.bias"]["shape"] = {9}; }); }},
      {"shape mismatch", "expected [32, 8]",
       [](const std::string& b) {
         return edit_header(b, [](json& h) { h["h.0.mlp.c_fc.weight"]["shape"] = {8, 32}; });
       }},
      {"missing tensor", "'h.1.ln_2.bias' is missing",
       [](const std::string& b) { return edit_header(b, [](json& h) { h.erase("h.1.ln_2.bias"); }); }},
      {"wrong dtype", "only F32",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["wpe.weight"]["dtype"] = "F16"; }); }},
      {"another model's config", "holds a model with",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["__metadata__"]["n_layer"] = "3"; }); }},
      {"non-numeric config", "not an integer",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["__metadata__"]["n_embd"] = "x"; }); }},
  };
}

TEST_CASE("truncated and corrupt weights are refused and nothing changes", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig c = test::tiny_config();
  Gpt source(c, ModelLayout::whole(c), nullptr), target(c, ModelLayout::whole(c), nullptr);
  test::randomize(source, 4);
  test::randomize(target, 5);
  save_weights(dir / "good.safetensors", source, 0);
  const std::string good = read_bytes(dir / "good.safetensors");
  std::vector<float> before(target.params().data(), target.params().data() + target.params().count());
  for (const Corruption& k : corruptions()) {
    SECTION(k.what) {
      const fs::path path = dir / "bad.safetensors";
      const std::string bad = k.apply(good);
      write_bytes(path, bad);
      std::string message = "no error";
      try {
        load_weights(path, target);
      } catch (const InvalidUsage& e) {
        message = e.what();
      }
      CHECK_THAT(message, Catch::Contains(path.string()) && Catch::Contains(k.expected_message));
      CHECK(std::memcmp(before.data(), target.params().data(), before.size() * 4) == 0);
      CHECK(read_bytes(path) == bad);
    }
  }
}

TEST_CASE("a checkpoint with a corrupt optimizer file changes nothing", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig c = test::tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr), target(c, ModelLayout::whole(c), nullptr);
  const Range all{0, model.table().count()};
  AdamW opt(model.table(), all, {}, nullptr), target_opt(target.table(), all, {}, nullptr);
  test::randomize(model, 6);
  const fs::path step_dir = save_checkpoint(dir.path(), model, opt, TrainState{3, json::object(), "x", 1, 2});
  const std::string moments = read_bytes(step_dir / "optimizer.safetensors");
  write_bytes(step_dir / "optimizer.safetensors", moments.substr(0, moments.size() / 2));
  CHECK_THROWS_WITH(load_checkpoint(step_dir, target, target_opt), Catch::Contains("optimizer.safetensors"));
  for (float x : target.params().span()) REQUIRE(x == 0.0f);
}

TEST_CASE("an atomic file that is not committed leaves the target untouched", "[checkpoint]") {
  test::TempDir dir;
  write_bytes(dir / "target", "old");
  {
    AtomicFile f(dir / "target");
    f.write("new!", 4);
  }  // abandoned, e.g. by an exception
  CHECK(read_bytes(dir / "target") == "old");
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
  write_file_atomically(dir / "target", "new");
  CHECK(read_bytes(dir / "target") == "new");
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

}  // namespace
}  // namespace braid::trainer
