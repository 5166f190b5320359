// The coordinator actor: a thin shell around CoordinatorState that turns its
// Actions into messages, keeps the run directories and forwards events.
#pragma once

#include <functional>
#include <string>

#include "actors/protocol.hpp"

namespace troupe::coord {

struct CoordinatorActorOptions {
  std::string runs_dir = "runs";
  int protocol = actors::kProtocolVersion;  // tests override it to see refusals
  // Every event, as one JSON text (state changes, steps, agents); called on an actor thread.
  std::function<void(const std::string&)> on_event;
  // How long aborted workers get to exit on their own before their agent SIGKILLs them.
  std::chrono::milliseconds kill_grace{2000};
  // "" = the job table lives in memory only. Otherwise it is saved to this
  // directory on every job transition and loaded from it when the actor starts
  // (coordinator/state.hpp: load_table); a malformed table throws troupe::Error.
  std::string state_dir;
  // The hardware profile (YAML) auto jobs are planned with when their spec names none
  // (`troupe coordinator --hardware`); "" = the device's default (plan/hardware.hpp).
  std::string default_hardware;
};

actors::coordinator_actor spawn_coordinator(caf::actor_system& sys, CoordinatorActorOptions options);

}  // namespace troupe::coord
