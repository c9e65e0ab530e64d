/* cmd_plugins.c: `dsarl plugins`: what was found, where, and what was refused and why. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dsarl/ops/dsa.h"

static void print_help(void)
{
    printf("usage: dsarl plugins [--plugin-path DIRS]\n"
           "\n"
           "Loads every dsarl-*.so on the plugin search path and prints, per ops table: kind, name, plugin\n"
           "version, ABI, file and description (plus the plugin's own notes; for DSA backends the route table:\n"
           "which engine serves each op at which sizes, a cuDNN graph or a hand-over to another backend's kernel);\n"
           "then every refused file with its one-line reason (a table whose mandatory slot is NULL, or too small\n"
           "for the ABI minor its plugin was built for, is refused naming the slot), and the search path in order.\n"
           "Exits 0 when the listing succeeded, refusals included: they are what it reports.\n");
}

static void emit_line(void *ctx, const char *line)
{
    (void)ctx;
    printf("      %s\n", line);
}

// A DSA backend's routes ("op | sizes | engine" per line), or the statement that it runs its own kernels throughout.
static void print_routes(const dsarl_dsa_ops *dsa)
{
    if (!DSARL_DSA_HAS(dsa, routes)) {
        printf("      routes: every op runs this backend's own kernels\n");
        return;
    }
    printf("      routes (op | sizes | engine):\n");
    for (const char *line = dsa->routes; *line;) {
        const char *end = strchr(line, '\n');
        int n = end ? (int)(end - line) : (int)strlen(line);
        if (n > 0)
            printf("        %.*s\n", n, line);
        line += n + (end ? 1 : 0);
    }
}

int cmd_plugins(int argc, char **argv, const cli_options *opts)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            print_help();
            return CLI_EXIT_OK;
        }
        fprintf(stderr, "dsarl plugins: error: unexpected argument '%s'\n", argv[i]);
        return CLI_EXIT_USAGE;
    }
    dsarl_registry *reg = NULL;
    dsarl_error err;
    if (cli_open_registry(NULL, opts, &reg, &err) < 0)
        return cli_fail(&err);

    printf("%-12s %-12s %-8s %-5s %-5s %s\n", "KIND", "NAME", "VERSION", "ABI", "RANK", "FILE");
    for (int kind = 0; kind < DSARL_KIND_COUNT; kind++) {
        for (size_t i = 0; i < dsarl_registry_ops_count(reg); i++) {
            const dsarl_ops_entry *e = dsarl_registry_ops_at(reg, i);
            if ((int)e->kind != kind)
                continue;
            char abi[16];
            snprintf(abi, sizeof abi, "%u.%u", e->plugin ? e->plugin->abi_major : DSARL_ABI_MAJOR,
                     e->plugin ? e->plugin->abi_minor : DSARL_ABI_MINOR);
            printf("%-12s %-12s %-8s %-5s %-5d %s\n", dsarl_kind_name(e->kind), e->ops->name,
                   e->plugin ? e->plugin->version : "-", abi, (int)e->ops->rank,
                   e->plugin ? e->plugin->path : "(built in)");
            if (e->ops->description && *e->ops->description)
                printf("      %s\n", e->ops->description);
            if (e->ops->describe)
                e->ops->describe(emit_line, NULL);
            if (e->kind == DSARL_KIND_DSA)
                print_routes((const dsarl_dsa_ops *)e->ops);
        }
    }
    size_t n_refused = dsarl_registry_refusal_count(reg);
    printf("\nrefused: %zu\n", n_refused);
    for (size_t i = 0; i < n_refused; i++)
        printf("  %s\n", dsarl_registry_refusal_at(reg, i)->reason);
    printf("\nsearch path:\n");
    for (size_t i = 0; i < dsarl_registry_search_dir_count(reg); i++) {
        const char *source = NULL;
        const char *dir = dsarl_registry_search_dir_at(reg, i, &source);
        printf("  %s  (%s)\n", dir, source);
    }
    dsarl_registry_free(reg);
    return CLI_EXIT_OK;
}
