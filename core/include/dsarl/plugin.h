/* dsarl/plugin.h: the plugin ABI. SDK tier: plugin ABI, with error.h, log.h, recipe.h, parallel.h and the ops/
 * headers (docs/sdk.md lists both tiers and what each promises).
 *
 * What a plugin calls. Plugins link libdsarl (pkg-config dsarl, or find_package(dsarl)) and call its exported
 * DSARL_API functions directly: errors, logging (dsarl_log), recipe reading, and the trainer services. Those
 * exports are versioned with the library (soname libdsarl.so.<major>; additions only within a major). The host
 * table below exists for what needs the registry instance that is loading the plugin: register_ops (mandatory,
 * the only way to register) and find_ops (lookup of other tables). host->log is an ABI 1.0 slot kept for
 * compatibility; it is the same logger as dsarl_log, which plugins should call instead.
 *
 * Versioning. Every slot added after 1.0 is tagged with its minor next to it. The loader checks each ops table
 * against the minor in its plugin's descriptor: the table must cover every slot that minor defines, every slot
 * marked mandatory for that minor must be non-NULL, and a slot this core calls unconditionally (device
 * gemm_f32out and convert, since 1.1) must be non-NULL even in an older plugin. A table that fails is refused at
 * registration with one line naming the file, kind, table and slot, and `dsarl plugins` prints it.
 *
 * A plugin is a shared object that exports exactly one symbol, DSARL_PLUGIN_SYMBOL, a dsarl_plugin_descriptor.
 * The host dlopen()s it (RTLD_NOW | RTLD_LOCAL, never unloaded), checks the descriptor, then calls init() with
 * the host API table; init registers one or more ops tables, each under a (kind, name) pair. Ops tables are
 * `static const`, start with a dsarl_ops_common, use designated initializers, and a NULL slot means "not
 * supported". Minimal plugin:
 *
 *     static const dsarl_environment_ops my_env = { .common = DSARL_OPS_COMMON(dsarl_environment_ops,
 *                                   DSARL_KIND_ENVIRONMENT, "myenv", "what it does", my_keys), .score = my_score };
 *     static int my_init(const dsarl_host *host, dsarl_error *err) {
 *         return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &my_env.common, err);
 *     }
 *     DSARL_PLUGIN_DEFINE("myenv", "1.0.0", "An example environment", my_init)
 */
#ifndef DSARL_PLUGIN_H
#define DSARL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/build_config.h"
#include "dsarl/error.h"
#include "dsarl/log.h"
#include "dsarl/recipe.h"

DSARL_BEGIN_DECLS

/* ABI major: bumped on any change that breaks existing plugins; the host refuses a different major.
 * ABI minor: bumped whenever a slot is added (at a struct's end or in reserved space); the host accepts plugins
 * built against an older or equal minor and reads newer ops slots only when struct_size covers them and they are
 * set. 1.1: token_batch.logit_scale, dsa preferred_form/headwise/routes, device gemm_f32out/convert. 1.2: model
 * accepts/flops/train_forward/train_backward, ops_common.rank, device capabilities/stream, dsa device_requires.
 * 1.3: device collectives (all_reduce ... recv) on the process groups of dsarl/comm.h, dsarl_parallel's groups,
 * model plan (sizes under a layout, for `dsarl plan`).
 * 1.4: pipeline parallelism: model stage_forward/stage_backward/stage_transfer (the 1F1B schedule of
 * dsarl_trainer_train_microbatches), dsarl_stage_transfer, dsarl/pipeline.h's stage split; environment
 * reward_components/score_components (a reward vector per response) and step (multi-turn episodes).
 * 1.5: paged generation caches: model cache_token_bytes/paged_cache_create/forward_paged/cache_copy_block and
 * dsarl_block_tables; device sample_filtered (top-k/top-p/temperature draws on the device, dsarl/sampling.h);
 * model mtp_loss (multi-token prediction in training), dsarl_train_microbatch.mtp_loss;
 * interleaved virtual pipeline stages: dsarl_parallel.vpp_size, dsarl/pipeline.h's chunk split
 * (dsarl_pipeline_chunk_layers), the stage ops' slots under the interleaved schedule.
 * 1.7: device profile_scope (op classes for profiles), moe_group_padded (MoE grouping on the device),
 * memory_info (free and total device memory), gemm_grouped (a MoE layer's expert products in one call). */
#define DSARL_ABI_MAJOR 1
#define DSARL_ABI_MINOR 7

/* The one symbol a plugin exports. */
#define DSARL_PLUGIN_SYMBOL "dsarl_plugin_descriptor_v1"

/* Plugin kinds. Numbering is part of the ABI: append only. */
typedef enum dsarl_kind {
    DSARL_KIND_MODEL = 0,       /* a model family: builds, runs and trains a network (policy.model_family) */
    DSARL_KIND_DEVICE = 1,      /* layer primitives on one kind of processor (runtime.device) */
    DSARL_KIND_DSA = 2,         /* DeepSeek Sparse Attention kernels (...model_overrides.dsa_kernel_backend) */
    DSARL_KIND_GENERATION = 3,  /* a rollout engine (policy.generation.backend) */
    DSARL_KIND_ALGORITHM = 4,   /* the training loop (algorithm.name) */
    DSARL_KIND_ENVIRONMENT = 5, /* reward computation (data.*.env_name, env.<name>) */
    DSARL_KIND_COUNT = 6
} dsarl_kind;

/* "model", "device", "dsa", "generation", "algorithm", "environment"; NULL for an unknown kind. */
DSARL_API const char *dsarl_kind_name(dsarl_kind kind);

/* Parses a kind name; returns 0 and sets *out, or -1. */
DSARL_API int dsarl_kind_parse(const char *name, dsarl_kind *out);

/* ------------------------------------------------------------------------------------------------------------
 * Recipe keys a plugin reads. The core validates the resolved recipe against every selected plugin's keys before
 * heavy work starts: a wrong type fails with the location; an unknown key below a prefix the plugin owns fails
 * with "did you mean"; keys outside every owned prefix are reported as unused. */

typedef enum dsarl_key_type {
    DSARL_KEY_BOOL = 0,
    DSARL_KEY_INT = 1,
    DSARL_KEY_FLOAT = 2,  /* accepts integers too */
    DSARL_KEY_STRING = 3,
    DSARL_KEY_LIST = 4,
    DSARL_KEY_MAP = 5,
    DSARL_KEY_ANY = 6,
} dsarl_key_type;

/* Key flags. */
#define DSARL_KEY_NULLABLE 0x1u  /* null is a valid value */
#define DSARL_KEY_OWNED 0x2u     /* path is a section this plugin owns: unknown keys below it are errors */
#define DSARL_KEY_IGNORED 0x4u   /* accepted for NeMo RL compatibility but not used; reported as unused */

/* One declared key. `path` is absolute and dotted; a segment "*" matches any one key ("env.*.num_workers"). */
typedef struct dsarl_key_spec {
    const char *path;
    dsarl_key_type type;
    const char *default_value; /* YAML flow text applied when the key is absent ("0.2", "null", "[]"), or NULL */
    const char *doc;           /* one line */
    uint32_t flags;            /* DSARL_KEY_* flags */
} dsarl_key_spec;

/* ABI 1.6: one list of keys to join into a plugin's table, e.g. its own keys and libdsarl's checkpoint keys. */
typedef struct dsarl_key_list {
    const dsarl_key_spec *keys;
    size_t n_keys;
} dsarl_key_list;

/* ABI 1.6: copies lists[0..n_lists), in order, into table[0..capacity) and sets *n_out to the keys copied. When
 * they hold more than capacity keys it copies nothing, sets *n_out to 0 and fails (DSARL_E_INTERNAL, naming owner
 * and both counts), so a table too small is an error at plugin load and never a silently shortened key list. */
DSARL_API int dsarl_key_table_join(const char *owner, const dsarl_key_list *lists, size_t n_lists,
                                   dsarl_key_spec *table, size_t capacity, size_t *n_out, dsarl_error *err);

/* ------------------------------------------------------------------------------------------------------------
 * The common head of every ops table. */

typedef struct dsarl_ops_common {
    uint32_t struct_size;          /* sizeof the full ops struct as the plugin was compiled; must be first */
    uint32_t kind;                 /* a dsarl_kind; set by DSARL_OPS_COMMON */
    const char *name;              /* selection name ("reference", "glm5.2", ...) */
    const char *description;       /* one line for `dsarl plugins` */
    const dsarl_key_spec *keys;    /* recipe keys this table reads, or NULL */
    size_t n_keys;
    /* Optional: appends lines to `dsarl plugins` (e.g. which engine serves which op); NULL if none. */
    void (*describe)(void (*emit)(void *ctx, const char *line), void *ctx);
    /* ABI 1.2, optional (0 = never by default): preference where a recipe leaves the choice open (GStreamer's
     * autoplugging): among the tables of a kind that can serve the device, the core takes the highest rank; 0 (older
     * plugins) = never by default. */
    int32_t rank;
    uint32_t reserved_flags;
    void *reserved[3];
} dsarl_ops_common;

/* Ranks for dsarl_ops_common.rank. */
#define DSARL_RANK_NONE 0        /* chosen only by name */
#define DSARL_RANK_FALLBACK 64   /* correct everywhere it runs, not fast (a reference implementation) */
#define DSARL_RANK_SECONDARY 128 /* a good choice, below the primary */
#define DSARL_RANK_PRIMARY 256   /* the best this build has for the device */

#define DSARL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Initializers for the head of an ops table of type T: with a static dsarl_key_spec array, or with no keys. */
#define DSARL_OPS_COMMON_KEYS(T, kind_, name_, desc_, keys_, n_keys_)                                     \
    { .struct_size = (uint32_t)sizeof(T), .kind = (kind_), .name = (name_), .description = (desc_),      \
      .keys = (keys_), .n_keys = (n_keys_) }
#define DSARL_OPS_COMMON(T, kind_, name_, desc_, keys_) \
    DSARL_OPS_COMMON_KEYS(T, kind_, name_, desc_, keys_, DSARL_ARRAY_LEN(keys_))
#define DSARL_OPS_COMMON_NOKEYS(T, kind_, name_, desc_) DSARL_OPS_COMMON_KEYS(T, kind_, name_, desc_, NULL, 0)
/* ABI 1.2: the same heads with a DSARL_RANK_* preference (dsarl_ops_common.rank). */
#define DSARL_OPS_COMMON_KEYS_RANKED(T, kind_, name_, desc_, keys_, n_keys_, rank_)                            \
    { .struct_size = (uint32_t)sizeof(T), .kind = (kind_), .name = (name_), .description = (desc_),      \
      .keys = (keys_), .n_keys = (n_keys_), .rank = (rank_) }
#define DSARL_OPS_COMMON_RANKED(T, kind_, name_, desc_, keys_, rank_) \
    DSARL_OPS_COMMON_KEYS_RANKED(T, kind_, name_, desc_, keys_, DSARL_ARRAY_LEN(keys_), rank_)

/* ------------------------------------------------------------------------------------------------------------
 * The host API, passed to init(). Append only; check struct_size before using a slot added in a later minor. */

typedef struct dsarl_host {
    uint32_t struct_size;
    uint32_t abi_major, abi_minor;
    const char *host_version;      /* dsarl's version string */
    void *host_private;            /* for the host; plugins must not touch it */

    /* Registers a static ops table under (kind, ops->name). Fails (and the whole file is refused, even if init
     * ignores the error) on a duplicate (naming both files), on a struct_size smaller than the plugin's minor
     * defines for the kind, on a NULL mandatory slot (naming it), or on a bad head. */
    int (*register_ops)(const struct dsarl_host *host, dsarl_kind kind, const dsarl_ops_common *ops,
                        dsarl_error *err);

    /* The registered ops table (kind, name), or NULL. Lets a model find device/dsa tables, etc. */
    const dsarl_ops_common *(*find_ops)(const struct dsarl_host *host, dsarl_kind kind, const char *name);

    /* Logging through the host's logger (level, timestamps, rank prefix): the same as dsarl_log, kept from 1.0;
     * new plugins call dsarl_log. */
    void (*log)(const struct dsarl_host *host, dsarl_log_level level, const char *fmt, ...) DSARL_PRINTF(3, 4);

    void *reserved[16];
} dsarl_host;

/* ------------------------------------------------------------------------------------------------------------
 * The descriptor. */

typedef struct dsarl_plugin_descriptor {
    uint32_t abi_major;       /* DSARL_ABI_MAJOR the plugin was built against */
    uint32_t abi_minor;       /* DSARL_ABI_MINOR the plugin was built against */
    uint32_t struct_size;     /* sizeof(dsarl_plugin_descriptor) as the plugin saw it */
    uint32_t reserved0;
    const char *name;         /* plugin file name stem without the "dsarl-" prefix, e.g. "dsa-tilelang" */
    const char *version;      /* the plugin's own version, e.g. "0.1.0" */
    const char *build_sig;    /* DSARL_BUILD_SIG as the plugin saw it: layout-changing build options */
    const char *description;  /* one line */
    int (*init)(const dsarl_host *host, dsarl_error *err); /* registers ops tables; returns 0 or a dsarl_status */
    void *reserved[8];
} dsarl_plugin_descriptor;

/* Defines the exported descriptor of a plugin. */
#define DSARL_PLUGIN_DEFINE(name_, version_, desc_, init_)                                             \
    DSARL_PLUGIN_EXPORT extern const dsarl_plugin_descriptor dsarl_plugin_descriptor_v1;               \
    const dsarl_plugin_descriptor dsarl_plugin_descriptor_v1 = {                                       \
        .abi_major = DSARL_ABI_MAJOR, .abi_minor = DSARL_ABI_MINOR,                                    \
        .struct_size = (uint32_t)sizeof(dsarl_plugin_descriptor), .name = (name_), .version = (version_), \
        .build_sig = DSARL_BUILD_SIG, .description = (desc_), .init = (init_)};

DSARL_END_DECLS

#endif /* DSARL_PLUGIN_H */
