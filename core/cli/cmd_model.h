/* cmd_model.h: the model tools of the dsarl binary (`dsarl logits`, `dsarl generate`). */
#ifndef DSARL_CMD_MODEL_H
#define DSARL_CMD_MODEL_H

/* `dsarl logits --model-dir DIR --input-ids FILE.json --out OUT.npy`: float32 [B,S,V] logits of a glm_moe_dsa
 * directory for equal-length rows of token ids. Returns the process exit status. */
int dsarl_cmd_logits(int argc, char **argv);

/* `dsarl generate --model-dir DIR --prompt-ids 1,2,3 --max-new-tokens N (--greedy | --temperature T) ...`: runs the
 * native generation engine and prints the new token ids as a JSON list (with --logprobs, an object that adds the
 * log-probabilities and the truncated flag). Returns the process exit status. */
int dsarl_cmd_generate(int argc, char **argv);

#endif /* DSARL_CMD_MODEL_H */
