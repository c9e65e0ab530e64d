/* cmd_config.c: `dsarl config show` (the resolved recipe with origins) and `dsarl config keys` (declared schema). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "schema.h"
#include "selection.h"

static void print_help(void)
{
    printf("usage: dsarl config show RECIPE [key=value ...]\n"
           "       dsarl config keys [KIND/NAME]\n"
           "\n"
           "show: loads RECIPE with its defaults chain, applies the overrides (a.b=v must exist, +a.b=v adds,\n"
           "++a.b=v adds or sets, ~a.b deletes), resolves ${...} interpolations and prints the result as YAML,\n"
           "each value followed by where it came from (file:line:col, command line argument, or a plugin's\n"
           "default). Then the plugin each kind resolves to, and the keys no selected plugin uses.\n"
           "keys: prints every recipe key the loaded plugins declare: path, type, default, and what it does.\n");
}

static const char *const key_type_names[] = {"bool", "int", "float", "string", "list", "map", "any"};

static void print_keys_of(const dsarl_ops_common *ops)
{
    printf("%s/%s: %s\n", dsarl_kind_name((dsarl_kind)ops->kind), ops->name,
           ops->description ? ops->description : "");
    if (!ops->n_keys)
        printf("  (no keys)\n");
    for (size_t k = 0; k < ops->n_keys; k++) {
        const dsarl_key_spec *spec = &ops->keys[k];
        const char *type = (unsigned)spec->type < 7 ? key_type_names[spec->type] : "?";
        printf("  %-60s %-6s%s default %-10s %s%s%s\n", spec->path, type,
               (spec->flags & DSARL_KEY_NULLABLE) ? "?" : " ", spec->default_value ? spec->default_value : "-",
               spec->doc ? spec->doc : "", (spec->flags & DSARL_KEY_OWNED) ? " [owned section]" : "",
               (spec->flags & DSARL_KEY_IGNORED) ? " [accepted, unused]" : "");
    }
}

static int config_keys(int argc, char **argv, const cli_options *opts)
{
    if (argc > 3) {
        fprintf(stderr, "dsarl config keys: error: expected at most one KIND/NAME, got %d arguments\n", argc - 2);
        return CLI_EXIT_USAGE;
    }
    dsarl_registry *reg = NULL;
    dsarl_error err;
    if (cli_open_registry(NULL, opts, &reg, &err) < 0)
        return cli_fail(&err);
    int status = CLI_EXIT_OK;
    if (argc == 3) {
        char kind_name[64];
        const char *slash = strchr(argv[2], '/');
        dsarl_kind kind;
        if (!slash || (size_t)(slash - argv[2]) >= sizeof kind_name) {
            fprintf(stderr, "dsarl config keys: error: '%s' is not KIND/NAME (e.g. dsa/reference)\n", argv[2]);
            dsarl_registry_free(reg);
            return CLI_EXIT_USAGE;
        }
        memcpy(kind_name, argv[2], (size_t)(slash - argv[2]));
        kind_name[slash - argv[2]] = '\0';
        if (dsarl_kind_parse(kind_name, &kind) != 0) {
            fprintf(stderr,
                    "dsarl config keys: error: unknown plugin kind '%s'; kinds are model, device, dsa, generation, "
                    "algorithm, environment\n",
                    kind_name);
            dsarl_registry_free(reg);
            return CLI_EXIT_USAGE;
        }
        const dsarl_ops_common *ops = NULL;
        char where[128];
        snprintf(where, sizeof where, "command line '%s'", argv[2]);
        if (dsarl_registry_require(reg, kind, slash + 1, where, &ops, &err) < 0) {
            status = cli_fail(&err);
        } else {
            print_keys_of(ops);
        }
    } else {
        for (int kind = 0; kind < DSARL_KIND_COUNT; kind++)
            for (size_t i = 0; i < dsarl_registry_ops_count(reg); i++)
                if ((int)dsarl_registry_ops_at(reg, i)->kind == kind)
                    print_keys_of(dsarl_registry_ops_at(reg, i)->ops);
    }
    dsarl_registry_free(reg);
    return status;
}

static void print_choice(const dsarl_choice *c)
{
    printf("#   %-11s %-10s %s%s\n", dsarl_kind_name(c->kind), c->name, c->selected_by,
           c->ops ? "" : "  [NOT AVAILABLE: `dsarl run` would stop here]");
}

static int config_show(int argc, char **argv, const cli_options *opts)
{
    if (argc < 3) {
        fprintf(stderr, "dsarl config show: error: missing RECIPE (a YAML file)\n");
        return CLI_EXIT_USAGE;
    }
    for (int i = 2; i < argc; i++) // an option is never an override (no key starts with "--")
        if (strncmp(argv[i], "--", 2) == 0) {
            fprintf(stderr, "dsarl config show: error: unknown option '%s'; see `dsarl config --help`\n", argv[i]);
            return CLI_EXIT_USAGE;
        }
    dsarl_error err;
    cli_session session;
    if (cli_open_session(argv[2], argc - 3, argv + 3, opts, &session, &err) < 0)
        return cli_fail(&err);
    dsarl_recipe *recipe = session.recipe;
    dsarl_selection sel = session.selection;
    int status = CLI_EXIT_OK;
    /* Plugin defaults are filled in before printing, so the output shows the values a run would use. */
    dsarl_schema_table tables[DSARL_SELECTION_MAX_TABLES];
    size_t n_tables = dsarl_selection_schema_tables(&sel, tables);
    dsarl_schema_report report;
    dsarl_schema_report_init(&report);
    if (dsarl_schema_check_only(recipe, tables, n_tables, &report, &err) < 0 ||
        dsarl_recipe_write(recipe, stdout, 1, &err) < 0) {
        dsarl_schema_report_free(&report);
        status = cli_fail(&err);
        goto done;
    }
    printf("\n# plugins this recipe selects (kind, name, selected by):\n");
    print_choice(&sel.algorithm);
    print_choice(&sel.model);
    print_choice(&sel.device);
    print_choice(&sel.dsa);
    print_choice(&sel.generation);
    for (int i = 0; i < sel.n_environments; i++)
        print_choice(&sel.environments[i]);
    printf("\n# unused keys (no selected plugin reads them): %zu\n", report.n_unused);
    for (size_t i = 0; i < report.n_unused; i++)
        printf("#   %-60s %s  (%s)\n", report.unused[i].path, report.unused[i].where, report.unused[i].detail);
    printf("\n# problems (`dsarl run` stops at the first): %zu\n", report.n_problems);
    for (size_t i = 0; i < report.n_problems; i++)
        printf("#   %s\n", report.problems[i].detail);
    if (report.n_problems) { // the recipe printed is one `dsarl run` would refuse: say so in the exit status too
        fprintf(stderr, "dsarl config show: %zu problem(s) in the recipe (listed at the end); `dsarl run` would stop "
                "at the first\n", report.n_problems);
        status = CLI_EXIT_INVALID;
    }
    dsarl_schema_report_free(&report);
done:
    cli_close_session(&session);
    return status;
}

int cmd_config(int argc, char **argv, const cli_options *opts)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        print_help();
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    for (int i = 2; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            print_help();
            return CLI_EXIT_OK;
        }
    }
    if (strcmp(argv[1], "show") == 0)
        return config_show(argc, argv, opts);
    if (strcmp(argv[1], "keys") == 0)
        return config_keys(argc, argv, opts);
    fprintf(stderr, "dsarl config: error: unknown subcommand '%s'; use show or keys\n", argv[1]);
    return CLI_EXIT_USAGE;
}
