/* cmd_run.c: `dsarl run RECIPE [overrides]`: resolve, select and validate everything, then hand over to the
 * algorithm plugin. Every check that can fail on bad input runs before any model is built. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dsarl/log.h"
#include "dsarl/ops/algorithm.h"
#include "comm_internal.h"
#include "layout.h"
#include "selection.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void print_help(void)
{
    printf("usage: dsarl run RECIPE [key=value ...] [--plugin-path DIRS] [--log-level LEVEL]\n"
           "\n"
           "Runs the job a recipe describes (GRPO for NeMo RL-style recipes). Overrides use Hydra's grammar:\n"
           "a.b=v (key must exist), +a.b=v (new key), ++a.b=v (either), ~a.b (delete); values are YAML flow\n"
           "scalars, lists or maps. Plugins are chosen by recipe keys (see `dsarl config show RECIPE`), e.g.\n"
           "policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang or runtime.device=cpu.\n"
           "SIGINT/SIGTERM finish the current step, write a checkpoint and exit with status 130.\n");
}

int cmd_run(int argc, char **argv, const cli_options *opts)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            print_help();
            return CLI_EXIT_OK;
        }
        if (strncmp(argv[i], "--", 2) == 0) {
            fprintf(stderr, "dsarl run: error: unknown option '%s'; see `dsarl run --help`\n", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    if (argc < 2) {
        fprintf(stderr, "dsarl run: error: missing RECIPE (a YAML file)\n");
        return CLI_EXIT_USAGE;
    }
    dsarl_error err;
    cli_session session;
    if (cli_open_session(argv[1], argc - 2, argv + 2, opts, &session, &err) < 0)
        return cli_fail(&err);
    dsarl_recipe *recipe = session.recipe;
    dsarl_registry *reg = session.registry;
    dsarl_selection sel = session.selection;
    const dsarl_node *root = dsarl_recipe_root(recipe);
    int status = CLI_EXIT_OK;
    /* Validate the whole recipe against what the host and the available selected plugins declare before anything
     * heavy starts. */
    dsarl_schema_table tables[DSARL_SELECTION_MAX_TABLES];
    size_t n_tables = dsarl_selection_schema_tables(&sel, tables);
    dsarl_schema_report report;
    dsarl_schema_report_init(&report);
    if (dsarl_schema_validate(recipe, tables, n_tables, &report, &err) < 0) {
        dsarl_schema_report_free(&report);
        status = cli_fail(&err);
        goto done;
    }
    for (size_t i = 0; i < report.n_unused; i++)
        dsarl_log(DSARL_LOG_DEBUG, "unused recipe key %s (%s): %s", report.unused[i].path, report.unused[i].where,
                  report.unused[i].detail);
    if (report.n_unused)
        dsarl_log(DSARL_LOG_INFO, "%zu recipe keys are read by no selected plugin (`dsarl config show` lists them)",
                  report.n_unused);
    dsarl_schema_report_free(&report);
    /* Typos in keys are reported first (above); then a selected plugin that is missing or refused. */
    if (dsarl_selection_require(&sel, reg, 0, &err) < 0) {
        cli_fail(&err);
        status = CLI_EXIT_PLUGIN;
        goto done;
    }
    dsarl_log(DSARL_LOG_INFO, "algorithm %s, model %s, device %s, dsa %s, generation %s", sel.algorithm.name,
              sel.model.name, sel.device.name, sel.dsa.name, sel.generation.name);
    const dsarl_dsa_ops *dsa_ops = (const dsarl_dsa_ops *)sel.dsa.ops;
    if (dsa_ops && DSARL_DSA_HAS(dsa_ops, routes)) { // which engine serves each DSA op, so a hand-over is visible
        char routes[4096];
        size_t n = 0;
        for (const char *p = dsa_ops->routes; *p && n + 3 < sizeof routes; p++)
            if (*p != '\n')
                routes[n++] = *p;
            else if (p[1])
                routes[n++] = ';', routes[n++] = ' ';
        routes[n] = '\0';
        dsarl_log(DSARL_LOG_INFO, "dsa %s routes: %s", sel.dsa.name, routes);
    }

    const dsarl_environment_ops *env_ops[DSARL_MAX_ENVIRONMENTS];
    const char *env_names[DSARL_MAX_ENVIRONMENTS];
    for (int i = 0; i < sel.n_environments; i++) {
        env_ops[i] = (const dsarl_environment_ops *)sel.environments[i].ops;
        env_names[i] = sel.environments[i].name;
    }
    /* The parallel layout: checked against the processes launched before any model is built, then the groups. */
    dsarl_layout layout;
    dsarl_parallel parallel;
    bool log_all_ranks = false;
    if (dsarl_layout_for_job(root, dsarl_comm_world_size(opts->comm), &layout, &err) < 0 ||
        dsarl_recipe_bool_or(root, "runtime.log_all_ranks", false, &log_all_ranks, &err) < 0 ||
        dsarl_comm_build(opts->comm, &layout, &parallel, &err) < 0) {
        status = cli_fail(&err);
        goto done;
    }
    dsarl_log_set_all_ranks(log_all_ranks);
    if (layout.world + layout.generation > 1) {
        char text[256];
        dsarl_layout_describe(&layout, text, sizeof text);
        dsarl_log(DSARL_LOG_INFO, "parallel layout: %s", text);
    }
    dsarl_run_context ctx = {
        .struct_size = sizeof ctx,
        .host = dsarl_registry_host(reg),
        .recipe = root,
        .parallel = &parallel,
        .model_ops = (const dsarl_model_ops *)sel.model.ops,
        .device_ops = (const dsarl_device_ops *)sel.device.ops,
        .dsa_ops = (const dsarl_dsa_ops *)sel.dsa.ops,
        .generation_ops = (const dsarl_generation_ops *)sel.generation.ops,
        .environment_ops = env_ops,
        .environment_names = env_names,
        .n_environments = sel.n_environments,
        .stop_requested = &stop_requested,
    };
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    const dsarl_algorithm_ops *algorithm = (const dsarl_algorithm_ops *)sel.algorithm.ops;
    dsarl_error_clear(&err);
    int rc = algorithm->run(&ctx, &err);
    if (rc < 0)
        status = cli_fail(&err);
    else if (stop_requested)
        status = CLI_EXIT_INTERRUPTED;
done:
    cli_close_session(&session);
    return status;
}
