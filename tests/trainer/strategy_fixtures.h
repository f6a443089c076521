// Running Trainers on forked ranks (tests/comm/harness.h): each rank builds
// a Trainer over its world Communicator, runs a body, and writes what it saw
// as JSON, which the test (in the parent, where Catch2 runs) reads back.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_fixtures.h"
#include "trainer/train/trainer.h"

namespace braid::trainer::test {

// The body runs on every rank after trainer.start(); it fills `out`.
using RankBody = std::function<void(Trainer& trainer, nlohmann::json& out)>;

// Runs `body` on `ranks` forked ranks (a run of one rank still gets a
// communicator unless options.strategy is "none"); returns every rank's
// JSON. Fails the test, with every rank's error, when a rank fails. `algo`
// is BRAID_ALGO for the ranks: "ring" makes every all-reduce the ring,
// whose bytes the textbook theory counts, whatever the message size.
// `transport` is BRAID_TRANSPORT ("tcp": no shm, so no registered memory).
std::vector<nlohmann::json> run_trainers(int ranks, const TrainOptions& options, const TextCorpus& corpus,
                                         const RankBody& body, const std::string& algo = "auto",
                                         const std::string& transport = "auto");

// A body that runs `steps` steps and records per step: loss, grad_norm,
// bytes_sent, bytes_received; and the theory and the memory peaks.
RankBody record_steps(int steps);

// Every parameter tensor, whole, in table order (collective).
std::vector<float> gather_params(Trainer& trainer);

// The largest |a - b| over two equally long vectors.
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace braid::trainer::test
