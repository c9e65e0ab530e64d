/* main.c: the dsarl host binary: global options and subcommand dispatch.
 *
 *   dsarl run RECIPE [overrides]        dsarl plugins
 *   dsarl plan RECIPE [overrides]       (per-GPU memory and step time, nothing runs)
 *   dsarl config show RECIPE [overrides] dsarl config keys [KIND/NAME]
 *   dsarl logits ... / dsarl generate ... (model tools)
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cmd_bench.h"
#include "comm_internal.h"
#include "dsarl/build_config.h"
#include "dsarl/plugin.h"
#if __has_include("cmd_model.h")
#include "cmd_model.h"
#define DSARL_CLI_HAVE_MODEL_COMMANDS 1
#endif

static void print_usage(FILE *out)
{
    fprintf(out,
            "usage: dsarl [--log-level LEVEL] [--plugin-path DIRS] <command> [args]\n"
            "\n"
            "GRPO post-training for GLM-5.1 / GLM-5.2 (MoE + MLA + DeepSeek Sparse Attention).\n"
            "\n"
            "commands:\n"
            "  run RECIPE [key=value ...]          run the recipe's job (Hydra-style overrides: a.b=v, +a.b=v,\n"
            "                                      ++a.b=v, ~a.b)\n"
            "  plan RECIPE [key=value ...]         the layout at full model size: per-GPU memory and step time;\n"
            "                                      refuses a layout that does not fit (nothing runs)\n"
            "  plugins                             list plugins found, their ops tables, and refused files\n"
            "  config show RECIPE [key=value ...]  print the resolved recipe, each value with where it came from\n"
            "  config keys [KIND/NAME]             print the recipe keys plugins declare (type, default, doc)\n"
            "  bench dsa [options]                 time a DSA backend's kernels against the device's ceilings\n"
            "  bench train|generate [options]      a model config's training step (MFU) / greedy generation\n"
            "  bench comm [options]                the device's collectives over the launched ranks (mpirun)\n"
#ifdef DSARL_CLI_HAVE_MODEL_COMMANDS
            "  logits --model-dir DIR ...          next-token logits of a Hugging Face glm_moe_dsa model (.npy)\n"
            "  generate --model-dir DIR ...        greedy/sampled continuation of prompt token ids\n"
#endif
            "\n"
            "options (any position):\n"
            "  --log-level LEVEL   error, warn, info (default), debug, trace; also DSARL_LOG=LEVEL\n"
            "  --plugin-path DIRS  extra plugin directories (':'-separated), searched after the recipe's\n"
            "                      plugins.path and before DSARL_PLUGIN_PATH and lib/dsarl/plugins\n"
            "  --version           print version, plugin ABI and build signature\n"
            "  --help              this text; `dsarl <command> --help` for a command\n"
            "\n"
            "exit status: 0 success; 1 the job failed while running; 2 bad command line; 3 bad input (recipe,\n"
            "override, model directory, data); 4 a selected plugin is missing or refused; 130 interrupted.\n");
}

static int dispatch(int argc, char **argv, const cli_options *opts);

/* One rank of an mpirun/srun job starts MPI before anything else; a rank whose command fails ends the whole job
 * (it printed why, naming itself), so no peer waits forever in a collective. */
int main(int argc, char **argv)
{
    cli_options opts = {0};
    if (dsarl_comm_launched()) {
        dsarl_error err;
        dsarl_error_clear(&err);
        if (dsarl_comm_init(&opts.comm, &err) < 0)
            return cli_fail(&err);
    }
    int status = dispatch(argc, argv, &opts);
    if (opts.comm && status != CLI_EXIT_OK && dsarl_comm_world_size(opts.comm) > 1)
        dsarl_comm_abort(opts.comm, status);
    dsarl_comm_finalize(opts.comm);
    return status;
}

static int dispatch(int argc, char **argv, const cli_options *global)
{
    cli_options opts = *global;
    argc = cli_take_global_options(argc - 1, argv + 1, &opts);
    argv++;
    if (argc < 0)
        return CLI_EXIT_USAGE;
    if (argc == 0) {
        print_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *command = argv[0];
    if (cli_is_help(command) || strcmp(command, "help") == 0) {
        print_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(command, "--version") == 0 || strcmp(command, "version") == 0) {
        printf("dsarl %s (plugin ABI %d.%d, build signature %s)\n", DSARL_VERSION, DSARL_ABI_MAJOR, DSARL_ABI_MINOR,
               DSARL_BUILD_SIG);
        return CLI_EXIT_OK;
    }
    if (strcmp(command, "run") == 0)
        return cmd_run(argc, argv, &opts);
    if (strcmp(command, "plan") == 0)
        return cmd_plan(argc, argv, &opts);
    if (strcmp(command, "plugins") == 0)
        return cmd_plugins(argc, argv, &opts);
    if (strcmp(command, "config") == 0)
        return cmd_config(argc, argv, &opts);
    if (strcmp(command, "bench") == 0)
        return cmd_bench(argc, argv, &opts);
#ifdef DSARL_CLI_HAVE_MODEL_COMMANDS
    if (strcmp(command, "logits") == 0)
        return dsarl_cmd_logits(argc, argv);
    if (strcmp(command, "generate") == 0)
        return dsarl_cmd_generate(argc, argv);
#endif
    fprintf(stderr, "dsarl: error: unknown command '%s'; run `dsarl --help` for the list\n", command);
    return CLI_EXIT_USAGE;
}
