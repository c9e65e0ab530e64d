/* dsarl/export.h: symbol visibility for libdsarl and plugins.
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * Everything is built with -fvisibility=hidden; DSARL_API marks the functions libdsarl exports to the host
 * binary and to plugins, DSARL_PLUGIN_EXPORT marks the one descriptor symbol a plugin exports. */
#ifndef DSARL_EXPORT_H
#define DSARL_EXPORT_H

#if defined(__GNUC__)
#define DSARL_API __attribute__((visibility("default")))
#define DSARL_PLUGIN_EXPORT __attribute__((visibility("default")))
#define DSARL_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define DSARL_API
#define DSARL_PLUGIN_EXPORT
#define DSARL_PRINTF(fmt_index, first_arg)
#endif

#ifdef __cplusplus
#define DSARL_BEGIN_DECLS extern "C" {
#define DSARL_END_DECLS }
#else
#define DSARL_BEGIN_DECLS
#define DSARL_END_DECLS
#endif

#endif /* DSARL_EXPORT_H */
