/* test_keyword_environment.c: the example plugin's unit test, built only against the installed SDK and its test
 * kit (dsarl/testkit.h): load the plugin through the real loader from the directory given as argv[1], check it was
 * not refused, create it from a recipe string and score responses whose rewards are known.
 *
 *     cc test_keyword_environment.c $(pkg-config --cflags --libs dsarl) -o test_keyword && ./test_keyword DIR */
#include <stdio.h>
#include <string.h>

#include <dsarl/ops/environment.h>
#include <dsarl/testkit.h>

static int failures;

#define EXPECT(cond, ...)                                                                                           \
    do {                                                                                                            \
        if (!(cond)) {                                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                                           \
            fputc('\n', stderr);                                                                                    \
            failures++;                                                                                             \
        }                                                                                                           \
    } while (0)

/* Scores the same four responses under one recipe; expected holds the four rewards. */
static void score_under(const char *plugin_dir, const char *recipe, const float expected[4])
{
    dsarl_testkit *kit = NULL;
    dsarl_error err;
    if (dsarl_testkit_open(recipe, plugin_dir, &kit, &err) < 0) {
        EXPECT(0, "testkit: %s", err.message);
        return;
    }
    for (size_t i = 0; i < dsarl_testkit_refusal_count(kit); i++)
        EXPECT(strstr(dsarl_testkit_refusal_at(kit, i), "keyword") == NULL, "refused: %s",
               dsarl_testkit_refusal_at(kit, i));
    const dsarl_environment_ops *ops =
        (const dsarl_environment_ops *)dsarl_testkit_find(kit, DSARL_KIND_ENVIRONMENT, "keyword");
    EXPECT(ops != NULL, "environment 'keyword' not found in %s", plugin_dir);
    if (ops) {
        dsarl_environment *env = NULL;
        const dsarl_node *root = dsarl_testkit_recipe(kit);
        EXPECT(ops->create(root, dsarl_node_get(root, "env.keyword"), &env, &err) == 0, "create: %s", err.message);
        const char *responses[4] = {"the answer is 42", "The Answer Is 42", "no number here", ""};
        const char *truths[4] = {"answer is 42", "answer is 42", "42", "42"};
        float rewards[4] = {-1, -1, -1, -1};
        dsarl_verdict verdicts[4];
        EXPECT(ops->score(env, 4, responses, truths, rewards, verdicts, &err) == 0, "score: %s", err.message);
        for (int i = 0; i < 4; i++) {
            EXPECT(rewards[i] == expected[i], "%s: response %d: reward %g, expected %g", recipe, i, rewards[i],
                   expected[i]);
            EXPECT(verdicts[i] == (expected[i] > 0 ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG),
                   "%s: response %d: verdict %d", recipe, i, (int)verdicts[i]);
        }
        ops->destroy(env);
    }
    dsarl_testkit_free(kit);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN_DIR\n", argv[0]);
        return 2;
    }
    score_under(argv[1], "{}", (const float[4]){1, 0, 0, 0});
    score_under(argv[1], "env:\n  keyword:\n    case_sensitive: false\n    reward_correct: 2.5\n",
                (const float[4]){2.5f, 2.5f, 0, 0});
    if (failures == 0)
        printf("keyword environment: ok\n");
    return failures ? 1 : 0;
}
