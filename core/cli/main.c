/* main.c: the dsarl host binary (placeholder entry while the CLI lands). */
#include <stdio.h>
#include "dsarl/build_config.h"

int main(void)
{
    printf("dsarl %s\n", DSARL_VERSION);
    return 0;
}
