// The `troupe` command's subcommands. Each add_* registers one subcommand on the
// app; when it runs, it stores the process exit code in *exit_code.
//
// Exit codes (docs/cli.md): 0 success; 1 the job failed; 2 bad usage or an
// invalid spec; 130 interrupted.
#pragma once

namespace CLI {
class App;
}

namespace troupe::cli {

enum ExitCode : int { kOk = 0, kJobFailed = 1, kUsage = 2, kInterrupted = 130 };

void add_version_command(CLI::App& app, int* exit_code);
void add_validate_command(CLI::App& app, int* exit_code);
void add_run_command(CLI::App& app, int* exit_code);
void add_sample_command(CLI::App& app, int* exit_code);
void add_coordinator_command(CLI::App& app, int* exit_code);
void add_agent_command(CLI::App& app, int* exit_code);
void add_worker_command(CLI::App& app, int* exit_code);
void add_client_commands(CLI::App& app, int* exit_code);  // submit, status, list, watch, cancel
void add_ckpt_command(CLI::App& app, int* exit_code);     // ls, inspect, verify, export
void add_secret_command(CLI::App& app, int* exit_code);   // init
void add_plan_command(CLI::App& app, int* exit_code);
void add_data_command(CLI::App& app, int* exit_code);   // tokenize, encode, decode
void add_trace_command(CLI::App& app, int* exit_code);  // merge

}  // namespace troupe::cli
