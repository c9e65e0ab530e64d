/* cli.h: shared pieces of the dsarl host binary's subcommands. */
#ifndef DSARL_CLI_H
#define DSARL_CLI_H

#include "dsarl/error.h"
#include "recipe_internal.h"
#include "registry.h"
#include "selection.h"

/* Exit statuses of the dsarl binary (documented in `dsarl --help` and the README). */
enum {
    CLI_EXIT_OK = 0,          /* success */
    CLI_EXIT_FAILED = 1,      /* the job started and failed (device error, I/O during training, ...) */
    CLI_EXIT_USAGE = 2,       /* bad command line: unknown subcommand or option, missing argument */
    CLI_EXIT_INVALID = 3,     /* bad input: recipe, override, model directory, data file, an unsupported combination */
    CLI_EXIT_PLUGIN = 4,      /* a selected plugin is missing or was refused */
    CLI_EXIT_INTERRUPTED = 130 /* stopped by SIGINT/SIGTERM after a clean checkpoint */
};

/* Options every subcommand accepts (before or after the subcommand name). */
typedef struct dsarl_comm dsarl_comm;

typedef struct cli_options {
    const char *plugin_path;   /* --plugin-path DIR[:DIR...] */
    dsarl_comm *comm;          /* MPI when mpirun/srun started this process, else NULL (one process) */
} cli_options;

/* Prints "dsarl: error: <message>" on stderr and returns the exit status that fits err->code. */
int cli_fail(const dsarl_error *err);

/* Maps a dsarl_status to an exit status. */
int cli_exit_status(int code);

/* Strips the global options (--log-level L, --plugin-path P, and their --x=v forms) from argv in place, applying
 * the log level; returns the new argc, or -1 after printing a usage error. */
int cli_take_global_options(int argc, char **argv, cli_options *opts);

/* Loads RECIPE, applies the overrides (argv entries that are not options) and resolves interpolations. */
int cli_load_recipe(const char *path, int n_overrides, char **overrides, dsarl_recipe **out, dsarl_error *err);

/* A registry with the search path of docs/plugins.md ("Loading"): recipe plugins.path (root may be NULL), --plugin-path,
 * DSARL_PLUGIN_PATH, beside libdsarl; every plugin found is loaded. */
int cli_open_registry(const dsarl_node *root, const cli_options *opts, dsarl_registry **out, dsarl_error *err);

/* The device a command runs on: *name when set (its --device), else the highest-ranked device table with every
 * required_caps flag that this machine can run (*name is set to it). cmd names the command in errors. */
int cli_choose_device(const dsarl_registry *reg, const char *cmd, uint64_t required_caps, const char **name,
                      const dsarl_ops_common **out, dsarl_error *err);

/* The DSA backend on device: *name when set (its --backend), else the highest-ranked backend that runs on it. */
int cli_choose_dsa(const dsarl_registry *reg, const char *cmd, const dsarl_ops_common *device, const char **name,
                   const dsarl_ops_common **out, dsarl_error *err);

/* A recipe resolved with its overrides, the plugins found for it, and what it selects. */
typedef struct cli_session {
    dsarl_recipe *recipe;
    dsarl_registry *registry;
    dsarl_selection selection;
} cli_session;

/* Loads and resolves the recipe, opens the registry (with the recipe's plugins.path) and selects the plugins. On
 * failure nothing stays allocated. */
int cli_open_session(const char *recipe_path, int n_overrides, char **overrides, const cli_options *opts,
                     cli_session *s, dsarl_error *err);

/* Frees what cli_open_session allocated. */
void cli_close_session(cli_session *s);

/* True when argv[i] asks for help. */
int cli_is_help(const char *arg);

/* Subcommands. argv[0] is the subcommand name. */
int cmd_run(int argc, char **argv, const cli_options *opts);
int cmd_plugins(int argc, char **argv, const cli_options *opts);
int cmd_config(int argc, char **argv, const cli_options *opts);
int cmd_plan(int argc, char **argv, const cli_options *opts);

#endif /* DSARL_CLI_H */
