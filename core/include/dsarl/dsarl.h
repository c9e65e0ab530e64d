/* dsarl/dsarl.h: the plugin ABI in one include (trainer services are included one by one). Plugins may include
 * just the headers they use. SDK tier: plugin ABI (docs/sdk.md); the ops headers also bring in tensor.h and
 * tokenizer.h. */
#ifndef DSARL_DSARL_H
#define DSARL_DSARL_H

#include "dsarl/build_config.h"
#include "dsarl/error.h"
#include "dsarl/log.h"
#include "dsarl/parallel.h"
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"
#include "dsarl/tensor.h"
#include "dsarl/ops/algorithm.h"
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"
#include "dsarl/ops/environment.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"

#endif /* DSARL_DSARL_H */
