// Checkpoints: safetensors round trips, training checkpoints, atomic writes,
// and refusal of truncated or corrupt files without touching anything.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "model_fixtures.h"
#include "runtime/errors.h"
#include "trainer/checkpoint/atomic_file.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/sharded.h"

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
      // The parser's message quotes what it read: a corrupt file's raw
      // bytes went to the terminal (a review helper's case).
      {"bad JSON of raw bytes", "\\xff", [](const std::string& b) { std::string s = b; s[8] = '\xff'; return s; }},
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
      // Past the metadata's own checksum (an older braid's file has none):
      // the config checks still refuse another model or a malformed value.
      {"another model's config", "holds a model with",
       [](const std::string& b) {
         return edit_header(b, [](json& h) {
           h["__metadata__"].erase("xxh3:__metadata__");
           h["__metadata__"]["n_layer"] = "3";
         });
       }},
      {"non-numeric config", "not an integer",
       [](const std::string& b) {
         return edit_header(b, [](json& h) {
           h["__metadata__"].erase("xxh3:__metadata__");
           h["__metadata__"]["n_embd"] = "x";
         });
       }},
      // Damage that no other check sees: a config value or the step changed.
      {"a damaged config value", "its __metadata__ (config, step, rank, checksums) does not match its checksum",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["__metadata__"]["n_layer"] = "3"; }); }},
      {"a damaged step", "its __metadata__ (config, step, rank, checksums) does not match its checksum",
       [](const std::string& b) { return edit_header(b, [](json& h) { h["__metadata__"]["step"] = "9"; }); }},
      // A flipped bit in the name of the metadata's own checksum key read
      // as an older braid's file: the metadata went unchecked.
      {"a damaged name of the metadata's checksum key", "holds the key 'xxh3:__metadatA__', the name of its own checksum",
       [](const std::string& b) {
         return edit_header(b, [](json& h) {
           json& m = h["__metadata__"];
           m["xxh3:__metadatA__"] = m["xxh3:__metadata__"];
           m.erase("xxh3:__metadata__");
         });
       }},
      {"a damaged prefix of the metadata's checksum key", "holds the key 'xxh2:__metadata__'",
       [](const std::string& b) {
         return edit_header(b, [](json& h) {
           json& m = h["__metadata__"];
           m["xxh2:__metadata__"] = m["xxh3:__metadata__"];
           m.erase("xxh3:__metadata__");
         });
       }},
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

// A flipped digit of state.json's learning rate or step parses as well as
// the true one; only its checksum tells them apart.
TEST_CASE("a state file whose contents changed is refused; one without a checksum loads", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig c = test::tiny_config();
  Gpt model(c, ModelLayout::whole(c), nullptr);
  const Range all{0, model.table().count()};
  AdamW opt(model.table(), all, {}, nullptr);
  const fs::path step_dir =
      save_checkpoint(dir.path(), model, opt, TrainState{3, json{{"lr", 0.05}, {"seed", 5}}, "x", 1, 2});
  const fs::path state_file = step_dir / "state.json";
  const std::string good = read_bytes(state_file);
  CHECK(read_train_state(step_dir).options["lr"] == 0.05);
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  for (const auto& [from, to] : {std::pair{"0.05", "0.07"}, std::pair{"\"step\": 3", "\"step\": 2"}}) {
    INFO(from << " -> " << to);
    write_bytes(state_file, replaced(from, to));
    CHECK_THROWS_WITH(read_train_state(step_dir),
                      Catch::Contains(state_file.string()) && Catch::Contains("do not match its checksum") &&
                          Catch::Contains("delete its \"checksum\" line"));
  }
  // A flipped bit in the checksum's key loaded the file unverified, as if
  // its line had been removed on purpose.
  write_bytes(state_file, replaced("\"checksum\"", "\"chec{sum\""));
  CHECK_THROWS_WITH(read_train_state(step_dir),
                    Catch::Contains("its checksum is under the key \"chec{sum\"") && Catch::Contains("damaged"));
  // An edit made on purpose, its checksum removed as the message says.
  json edited = json::parse(replaced("0.05", "0.07"));
  edited.erase("checksum");
  write_bytes(state_file, edited.dump(2));
  CHECK(read_train_state(step_dir).options["lr"] == 0.07);
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

// A model and its AdamW state, filled from `seed`.
struct Saved {
  GptConfig config = test::tiny_config();
  Gpt model{config, ModelLayout::whole(config), nullptr};
  AdamW opt{model.table(), Range{0, model.table().count()}, {}, nullptr};
  explicit Saved(std::uint64_t seed) {
    test::randomize(model, seed);
    Rng rng(seed + 1);
    for (float& x : opt.m().span()) x = static_cast<float>(rng.normal());
    for (float& x : opt.v().span()) x = static_cast<float>(rng.uniform());
  }
  fs::path save(const fs::path& dir, std::int64_t step, const StepFiles& extra = {}) const {
    return save_checkpoint(dir, model, opt, TrainState{step, json::object(), "x", 1, 2}, extra);
  }
  // Whether the checkpoint in step_dir holds this model and state.
  bool loads_from(const fs::path& step_dir) const {
    Saved got(999);
    load_checkpoint(step_dir, got.model, got.opt);
    return same(model.params(), got.model.params()) && same(opt.m(), got.opt.m()) && same(opt.v(), got.opt.v());
  }
};

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A file written again ends as open(2) with O_TRUNC leaves it: its
// permissions kept, a link kept with its target replaced (braid-bench's
// --json took this from a copy of its own, which did both; the
// checkpoints' replaced a link with a file and reset the permissions).
TEST_CASE("an atomic file keeps a replaced file's permissions and a link", "[checkpoint]") {
  test::TempDir dir;
  auto mode_of = [](const fs::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  const mode_t mask = ::umask(022);
  write_file_atomically(dir / "new", "1");
  CHECK(mode_of(dir / "new") == 0644);
  REQUIRE(::chmod((dir / "new").c_str(), 0640) == 0);
  write_file_atomically(dir / "new", "2");
  CHECK(mode_of(dir / "new") == 0640);
  ::umask(mask);
  fs::create_directory(dir / "elsewhere");
  fs::create_symlink("elsewhere/../new", dir / "link");
  fs::create_symlink("link", dir / "link2");
  write_file_atomically(dir / "link2", "3");
  CHECK(fs::is_symlink(dir / "link2"));
  CHECK(fs::is_symlink(dir / "link"));
  CHECK(read_bytes(dir / "new") == "3");
  CHECK(mode_of(dir / "new") == 0640);
  fs::create_symlink("made-by-write", dir / "dangling");
  write_file_atomically(dir / "dangling", "4");
  CHECK(fs::is_symlink(dir / "dangling"));
  CHECK(read_bytes(dir / "made-by-write") == "4");
  CHECK(names_in(dir.path()) ==
        std::vector<std::string>{"dangling", "elsewhere", "link", "link2", "made-by-write", "new"});
}

// A run resumed from an earlier step writes the same step numbers again: the
// new save replaces the step's directory whole (a manifest a sharded run
// left there would otherwise win over the new state.json), and a save that
// fails on the way leaves the old step as it was, `latest` still naming it.
TEST_CASE("a step saved again is replaced whole, and a failed save leaves it as it was", "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1), b(2), c(3);
  a.save(dir.path(), 4, {{"config.json", "a"}});
  write_bytes(dir / "step_00000004" / "manifest.json", "{\"stale\": true}");  // as a sharded run of step 4 left it
  write_bytes(dir / "step_00000004" / "shard_00000_of_00002.safetensors", "stale");
  b.save(dir.path(), 4, {{"config.json", "b"}});
  CHECK(names_in(dir / "step_00000004") ==
        std::vector<std::string>{"config.json", "model.safetensors", "optimizer.safetensors", "state.json"});
  CHECK(read_bytes(dir / "step_00000004" / "config.json") == "b");
  CHECK(b.loads_from(resolve_checkpoint(dir.path())));

  const std::string model_before = read_bytes(dir / "step_00000004" / "model.safetensors");
  // Fails after the model and the optimizer files are written.
  CHECK_THROWS_WITH(c.save(dir.path(), 4, {{"../escape", "x"}}), Catch::Contains("plain name"));
  CHECK(read_bytes(dir / "latest") == "step_00000004\n");
  CHECK(read_bytes(dir / "step_00000004" / "model.safetensors") == model_before);
  CHECK(read_bytes(dir / "step_00000004" / "config.json") == "b");
  CHECK(b.loads_from(dir / "step_00000004"));
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000004"});
}

// A run holds its checkpoint directory (DirectoryLock); one renamed away
// and replaced by another run's between the run's check of its hold and a
// save had the save publish by name: its step, `latest` and the pruning in
// the other run's directory.
TEST_CASE("a save publishes only into the directory the run holds", "[checkpoint]") {
  test::TempDir dir;
  const fs::path ckpt = dir / "ckpt", mine = dir / "mine", theirs = dir / "theirs";
  const Saved a(1), b(2);
  auto lock = DirectoryLock::take(ckpt, "this run");
  REQUIRE(lock != nullptr);
  a.save(ckpt, 1);
  b.save(theirs, 4);
  b.save(theirs, 5);
  fs::create_directories(theirs / "step_00000006.partial");  // the other run saving the same step
  write_bytes(theirs / "step_00000006.partial" / "model.safetensors", "theirs");
  fs::rename(ckpt, mine);
  fs::rename(theirs, ckpt);
  CHECK_THROWS_WITH(a.save(ckpt, 6, {}),
                    Catch::Contains(ckpt.string() + " is no longer the directory this run holds") &&
                        Catch::Contains("nothing is saved there"));
  CHECK(names_in(ckpt) == std::vector<std::string>{"latest", "step_00000004", "step_00000005", "step_00000006.partial"});
  CHECK(read_bytes(ckpt / "step_00000006.partial" / "model.safetensors") == "theirs");
  CHECK(read_bytes(ckpt / "latest") == "step_00000005\n");
  CHECK(names_in(mine) == std::vector<std::string>{".braid-train.lock", "latest", "step_00000001"});
  // Its name back: saves go on there.
  fs::rename(ckpt, theirs);
  fs::rename(mine, ckpt);
  CHECK(a.save(ckpt, 6) == ckpt / "step_00000006");
  CHECK(read_bytes(ckpt / "latest") == "step_00000006\n");
  // Errors name the directory, not the way to it (a name too long for the
  // file system fails in the staging directory).
  const std::string too_long(300, 'x');
  CHECK_THROWS_WITH(a.save(ckpt, 7, {{too_long, "x"}}),
                    Catch::Contains((ckpt / "step_00000007.partial").string()) && !Catch::Contains("/proc/self/fd"));
  lock.reset();
  // Not held: by name, as before.
  a.save(theirs, 7);
  CHECK(read_bytes(theirs / "latest") == "step_00000007\n");
}

// Pruning keeps the step just written whatever else the directory holds:
// steps after it (another run's, this one went back) stay, the older ones
// beyond `keep` go, in the order of their numbers, not of their names.
TEST_CASE("pruning never removes the step just written, and orders steps by number", "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1);
  a.save(dir.path(), 4);
  a.save(dir.path(), 6);
  fs::create_directories(dir / "step_00000003.partial");  // a save that died
  fs::create_directories(dir / "step_00000009.partial");  // one still being written, after this run's steps
  a.save(dir.path(), 1);
  CHECK(read_bytes(dir / "latest") == "step_00000001\n");
  CHECK(a.loads_from(resolve_checkpoint(dir.path())));
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000001", "step_00000003.partial",
                                                         "step_00000004", "step_00000006", "step_00000009.partial"});
  a.save(dir.path(), 2);
  a.save(dir.path(), 3);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000002", "step_00000003", "step_00000004",
                                                         "step_00000006", "step_00000009.partial"});

  test::TempDir wide;  // past eight digits the names no longer sort as the numbers do
  for (std::int64_t step : {99999999, 100000000, 100000001}) a.save(wide.path(), step);
  CHECK(names_in(wide.path()) == std::vector<std::string>{"latest", "step_100000000", "step_100000001"});
}

// A prune removed a step file by file under its own name: a run killed
// midway left step_N with state.json beside part of its files, listed as a
// step written whole. The step is renamed step_N.pruned first (seen here
// through inotify: the directory moves before any file of it goes), and a
// .pruned leftover is never a step and goes at the next prune.
TEST_CASE("a step is pruned by a rename before its files go", "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1);
  a.save(dir.path(), 1);
  a.save(dir.path(), 2);
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::inotify_add_watch(fd, (dir / "step_00000001").c_str(), IN_MOVE_SELF | IN_DELETE | IN_DELETE_SELF) >= 0);
  a.save(dir.path(), 3);  // keep 2: step 1 goes
  std::vector<std::uint32_t> events;
  alignas(inotify_event) char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) {
    for (char* p = buffer; p < buffer + n; p += sizeof(inotify_event) + reinterpret_cast<inotify_event*>(p)->len)
      events.push_back(reinterpret_cast<inotify_event*>(p)->mask & (IN_MOVE_SELF | IN_DELETE | IN_DELETE_SELF));
  }
  ::close(fd);
  REQUIRE(events.size() >= 2);
  CHECK(events.front() == IN_MOVE_SELF);
  CHECK(std::count(events.begin(), events.end(), IN_DELETE) >= 3);  // model, optimizer, state
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000002", "step_00000003"});

  // What a prune killed after its rename leaves: a step name with a state file.
  fs::create_directories(dir / "step_00000002.pruned");
  write_bytes(dir / "step_00000002.pruned" / "state.json", read_bytes(dir / "step_00000002" / "state.json"));
  fs::rename(dir / "step_00000003", dir / "step_00000003.pruned");
  fs::remove(dir / "latest");
  CHECK(layout::newest_complete_step(dir.path()) == dir / "step_00000002");
  CHECK(layout::is_step_name("step_00000002.pruned"));
  a.save(dir.path(), 4);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000002", "step_00000004"});
}

// Sets or clears the immutable flag of `file` (chattr +i / -i): a file that
// not even root may remove. False where the file system or the process's
// capabilities do not allow it.
bool set_immutable(const fs::path& file, bool on) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  int flags = 0;
  bool done = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
  flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
  done = done && ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
  ::close(fd);
  return done;
}

// The warnings logged while it lives, one line each.
class CapturedWarnings {
 public:
  CapturedWarnings() : before_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
    logger->set_level(spdlog::level::warn);
    logger->set_pattern("%v");
    spdlog::set_default_logger(logger);
  }
  ~CapturedWarnings() { spdlog::set_default_logger(before_); }
  std::string text() const { return out_.str(); }

 private:
  std::shared_ptr<spdlog::logger> before_;
  std::ostringstream out_;
};

// A prune that could not remove an older step (a file of it held open on
// NFS, another user's, immutable) threw out of the save after the new step
// was published: the save failed, and every later one failed on the same
// leftover while older steps piled up (a review helper's F1). The step it
// cannot remove stays, named in a warning, the others go, and the save
// stands; once the file can go, the next save removes it.
TEST_CASE("a step that cannot be pruned stays, named, and neither the save nor the other removals fail",
          "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1);
  a.save(dir.path(), 1);
  a.save(dir.path(), 2);
  const fs::path held = dir / "step_00000001" / "held";
  write_bytes(held, "a reader's file");
  if (!set_immutable(held, true)) {
    WARN("skipped: cannot make a file immutable here (needs root and a file system with chattr +i)");
    return;
  }
  struct Release {
    fs::path dir;
    ~Release() {  // whichever name the step has by then
      for (const char* name : {"step_00000001", "step_00000001.pruned"}) set_immutable(dir / name / "held", false);
    }
  } release{dir.path()};
  fs::create_directories(dir / "step_00000000.partial" / "deep");  // a save that died: a leftover, doomed too
  write_bytes(dir / "step_00000000.partial" / "deep" / "shard", "x");
  {
    CapturedWarnings warnings;
    CHECK_NOTHROW(a.save(dir.path(), 3));  // keep 2: step 1 goes, and the leftover
    CHECK_THAT(warnings.text(), Catch::Contains((dir / "step_00000001.pruned").string() + " stays (cannot remove " +
                                                (dir / "step_00000001.pruned" / "held").string()) &&
                                    Catch::Contains("the step just saved stands"));
  }
  CHECK(read_bytes(dir / "latest") == "step_00000003\n");
  CHECK(a.loads_from(resolve_checkpoint(dir.path())));
  // Renamed aside (never a step again), everything but the held file gone.
  CHECK(names_in(dir.path()) ==
        std::vector<std::string>{"latest", "step_00000001.pruned", "step_00000002", "step_00000003"});
  CHECK(names_in(dir / "step_00000001.pruned") == std::vector<std::string>{"held"});
  {
    CapturedWarnings warnings;  // tried again, in vain, without failing
    CHECK(a.save(dir.path(), 4) == dir / "step_00000004");
    CHECK_THAT(warnings.text(), Catch::Contains("step_00000001.pruned stays"));
  }
  CHECK(set_immutable(dir / "step_00000001.pruned" / "held", false));
  a.save(dir.path(), 5);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"latest", "step_00000004", "step_00000005"});
}

// A save may fail after it published its step (writing `latest` on a full
// disk): the error said "`latest` names the last step written whole" when
// `latest` named an older step, or did not exist. It says what the
// directory holds, and where to resume from.
TEST_CASE("a failed save says what the checkpoint directory holds", "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1);
  const std::string latest = (dir / "latest").string();
  CHECK(layout::after_failed_save(dir.path(), 2) ==
        latest + " does not exist or names nothing, and no step in " + dir.path().string() + " was written whole");
  a.save(dir.path(), 2);
  CHECK(layout::after_failed_save(dir.path(), 4) == latest + " names step_00000002, the last step written whole");
  a.save(dir.path(), 4);
  write_bytes(dir / "latest", "step_00000002\n");
  CHECK(layout::after_failed_save(dir.path(), 4) ==
        "step_00000004 was written whole, but " + latest + " names step_00000002 (it could not be moved to it): "
        "resume from " + (dir / "step_00000004").string());
  fs::remove(dir / "latest");
  CHECK(layout::after_failed_save(dir.path(), 4) ==
        "step_00000004 was written whole, but " + latest + " does not exist or names nothing (it could not be "
        "moved to it): resume from " + (dir / "step_00000004").string());
  CHECK(layout::after_failed_save(dir.path(), 6) == latest + " does not exist or names nothing; the newest step "
                                                     "written whole is " + (dir / "step_00000004").string());
  // A `latest` with more than a step's name was read as its first word.
  write_bytes(dir / "latest", "step_00000004 junk\n");
  CHECK_THROWS_WITH(resolve_checkpoint(dir.path()), Catch::Contains("does not name a step (it says 'step_00000004 junk...')"));
}

// What a sharded save that died left in the step's staging directory (a
// manifest, another world size's shard) is not published with the next one.
TEST_CASE("a sharded save publishes only its own files", "[checkpoint]") {
  test::TempDir dir;
  const Saved a(1);
  const fs::path staging = prepare_step_directory(dir.path(), 5);
  write_bytes(staging / "manifest.json", "{\"stale\": true}");
  write_bytes(staging / "shard_00002_of_00003.safetensors", "stale");
  std::vector<TensorPiece> pieces;
  for (const char* prefix : {"", "m.", "v."}) {
    const FlatBuffer& values = *prefix == 0 ? a.model.params() : *prefix == 'm' ? a.opt.m() : a.opt.v();
    for (const ParamView& v : a.model.table().views())
      pieces.push_back({prefix + v.name, 0, v.count(), values.data() + v.offset});
  }
  write_shard(staging, 0, 2, pieces, a.config, 5);
  write_shard(staging, 1, 2, {}, a.config, 5);
  const fs::path step_dir =
      commit_sharded_checkpoint(dir.path(), TrainState{5, json::object(), "x", 1, 2}, 2, "ddp", {{"config.json", "{}"}});
  CHECK(step_dir == dir / "step_00000005");
  CHECK(names_in(step_dir) == std::vector<std::string>{"config.json", "manifest.json", "shard_00000_of_00002.safetensors",
                                                       "shard_00001_of_00002.safetensors"});
  CHECK(a.loads_from(resolve_checkpoint(dir.path())));
}

// A shard of the same step copied in from another run (or another save of
// the step) loaded without a word, mixing two models: every shard carries
// its save's name, which the manifest records.
TEST_CASE("a shard from another save of the same step is refused by name", "[checkpoint]") {
  const Saved a(1);
  std::vector<TensorPiece> pieces;
  for (const char* prefix : {"", "m.", "v."}) {
    const FlatBuffer& values = *prefix == 0 ? a.model.params() : *prefix == 'm' ? a.opt.m() : a.opt.v();
    for (const ParamView& v : a.model.table().views())
      pieces.push_back({prefix + v.name, 0, v.count(), values.data() + v.offset});
  }
  test::TempDir first, second;
  for (const auto& [dir, save] : {std::pair{first.path(), "0123456789abcdef"}, std::pair{second.path(), "fedcba9876543210"}}) {
    const fs::path staging = prepare_step_directory(dir, 5);
    write_shard(staging, 0, 2, pieces, a.config, 5, nullptr, save);
    write_shard(staging, 1, 2, {}, a.config, 5, nullptr, save);
    commit_sharded_checkpoint(dir, TrainState{5, json::object(), "x", 1, 2}, 2, "ddp", {}, 2, save);
  }
  CHECK(a.loads_from(resolve_checkpoint(first.path())));
  const std::string shard = "shard_00001_of_00002.safetensors";
  fs::copy_file(second.path() / "step_00000005" / shard, first.path() / "step_00000005" / shard,
                fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH(CheckpointReader::open(first.path() / "step_00000005"),
                    Catch::Contains(shard + " was written by another save than its manifest (save 'fedcba9876543210', "
                                    "the manifest's '0123456789abcdef')"));

  // A manifest that names no save (edited, its checksum line removed as
  // README allows) checked the shards against nothing: the shards of two
  // saves loaded as one model (found by a review helper).
  test::TempDir third;
  const fs::path staging = prepare_step_directory(third.path(), 5);
  write_shard(staging, 0, 2, pieces, a.config, 5, nullptr, "0123456789abcdef");
  write_shard(staging, 1, 2, {}, a.config, 5, nullptr, "fedcba9876543210");
  commit_sharded_checkpoint(third.path(), TrainState{5, json::object(), "x", 1, 2}, 2, "ddp", {}, 2, "");
  CHECK_THROWS_WITH(CheckpointReader::open(third.path() / "step_00000005"),
                    Catch::Contains(shard + " was written by save 'fedcba9876543210' and "
                                            "shard_00000_of_00002.safetensors by save '0123456789abcdef'"));
}

// The same for a one-process checkpoint, whose model, optimizer and
// state files carried no save name: a model.safetensors or a state.json
// copied in from another run of the same shape loaded silently (another
// seed's state beside this run's weights).
TEST_CASE("a file of a one-process checkpoint from another save is refused by name", "[checkpoint]") {
  const Saved a(1), b(2);
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    test::TempDir first, second;
    a.save(first.path(), 5);
    b.save(second.path(), 5);
    CHECK(a.loads_from(resolve_checkpoint(first.path())));
    fs::copy_file(second.path() / "step_00000005" / file, first.path() / "step_00000005" / file,
                  fs::copy_options::overwrite_existing);
    INFO(file);
    CHECK_THROWS_WITH(CheckpointReader::open(first.path() / "step_00000005"),
                      Catch::Contains("was written by another save than its state.json") &&
                          Catch::Contains("would mix two models"));
  }
}

// A save that failed between publishing its step and writing `latest`
// (the first save of a run, on a full disk) left a whole step but no
// `latest`; --resume DIR then said DIR was no checkpoint and to pass
// --checkpoint-dir's directory, which DIR was.
TEST_CASE("a checkpoint directory without latest names the complete step it holds", "[checkpoint]") {
  const Saved a(1);
  test::TempDir dir;
  a.save(dir.path(), 3);
  a.save(dir.path(), 12);
  fs::remove(dir / "latest");
  fs::create_directories(dir / "step_00000020");  // not complete: no state
  CHECK_THROWS_WITH(resolve_checkpoint(dir.path()),
                    Catch::Contains("has no readable 'latest' (a save that failed before naming its step?), but "
                                    "holds the complete step step_00000012: pass that step directory"));
  CHECK(a.loads_from(resolve_checkpoint(dir / "step_00000012")));
  test::TempDir empty;
  CHECK_THROWS_WITH(resolve_checkpoint(empty.path()), Catch::Contains("is not a braid-train checkpoint"));
}

}  // namespace
}  // namespace braid::trainer
