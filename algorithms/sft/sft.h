/* sft.h: supervised fine-tuning on prompt/answer pairs, NeMo RL's SFT semantics (examples/configs/sft.yaml).
 *
 * A sample is the prompt rendered by the chat template (with the assistant's opening) followed by the answer text
 * (sft.answer_format around the example's ground truth, "Answer: {}" so a warm-started model writes what the math
 * environment rewards) and EOS. The loss is the mean negative log-likelihood of the answer tokens over the global
 * batch: every microbatch contributes sum(-logp) / (answer tokens in the global batch), so gradient accumulation
 * over microbatches gives exactly the global-batch mean. One AdamW step per global batch, with the shared LR schedule
 * and gradient clipping (dsarl/optimizer.h). Validation: the same loss on val_batches batches, and greedy decoding (no KV cache) with
 * exact match of the decoded answer. Checkpoints and automatic resume through dsarl/checkpoint.h; nothing in the
 * loop draws random numbers except the dataloader's order (a function of the seed and the epoch), so a resumed
 * CPU run is bit-identical to an uninterrupted one. */
#ifndef DSARL_SFT_H
#define DSARL_SFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/dataset.h"
#include "dsarl/ops/algorithm.h"
#include "dsarl/optimizer.h"
#include "dsarl/tokenizer.h"

/* Everything SFT reads from a recipe (strings borrow from it). */
typedef struct sft_config {
    int64_t max_num_steps;         /* sft.max_num_steps: optimizer steps */
    int64_t max_num_epochs;        /* sft.max_num_epochs: passes over the training set (whichever ends first) */
    int64_t val_period;            /* sft.val_period: validate every N steps; 0 = never */
    int64_t val_batches;           /* sft.val_batches: validation batches; <= 0 = the whole validation set */
    int64_t val_global_batch_size; /* sft.val_global_batch_size */
    int64_t val_micro_batch_size;  /* sft.val_micro_batch_size: sequences per validation forward */
    bool val_at_start, val_at_end; /* sft.val_at_start / sft.val_at_end */
    int64_t seed;                  /* sft.seed: data order and random init */
    const char *answer_format;     /* sft.answer_format: "{}" is the ground truth */
    int64_t global_batch;          /* policy.train_global_batch_size: samples per optimizer step */
    int64_t micro_batch;           /* policy.train_micro_batch_size: samples per forward/backward */
    int64_t max_seq_len;           /* policy.max_total_sequence_length: longer samples are cut (answer last) */
    int64_t max_new_tokens;        /* policy.generation.max_new_tokens: greedy validation decode length */
    bool shuffle;                  /* data.shuffle */
    const char *tokenizer_name;    /* policy.tokenizer.name (or policy.model_name) */
    const char *chat_template;     /* policy.tokenizer.chat_template; NULL = the tokenizer's default */
    dsarl_lr_schedule lr_schedule; /* policy.megatron_cfg.optimizer / scheduler, clip_grad; no warm-up by default */
} sft_config;

/* The keys of algorithm/sft: the owned sft section plus the policy/data keys it reads, the checkpointing,
 * optimizer, logger and dataset keys. Joined on first use; valid for the life of the process. Fails (and every
 * later call with it) only if they outgrow the table. */
int sft_recipe_keys(const dsarl_key_spec **keys, size_t *n, dsarl_error *err);

/* Reads and range-checks every SFT setting, naming the key's location on a bad value. */
int sft_config_from_recipe(const dsarl_node *root, sft_config *cfg, dsarl_error *err);

/* One tokenized sample: tokens (n) and targets (n), targets[t] = tokens[t + 1] where that token belongs to the
 * answer, else -1 (the model scores position t's next token). */
typedef struct sft_sample {
    int32_t *tokens, *targets;
    int32_t n;          /* tokens */
    int32_t prompt_len; /* tokens of the rendered prompt (the answer starts here) */
    int32_t n_answer;   /* answer tokens that are scored (after any cut) */
    char *answer;       /* the answer text (without EOS), for exact-match validation */
} sft_sample;

/* Renders and tokenizes an example: prompt via the chat template (with generation prompt), then the answer text
 * and EOS (when the tokenizer has one); a sample longer than max_seq_len is cut from the end. */
int sft_build_sample(const dsarl_tokenizer *tok, const char *chat_template, const char *answer_format,
                     const dsarl_example *ex, int64_t max_seq_len, sft_sample *out, dsarl_error *err);

/* Frees a sample's buffers (the struct itself is the caller's). */
void sft_sample_free(sft_sample *s);

/* Greedy completions of each sample's prompt (its first prompt_len tokens) without a KV cache: each new token
 * reruns the unfinished sequences, packed, through forward_logits and takes the argmax of each one's last row; up
 * to max_new tokens or EOS (left out). texts[i] gets the decoded text (malloc'd, special tokens skipped). */
int sft_greedy_complete(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_tokenizer *tok,
                        const sft_sample *samples, int64_t n, int64_t max_new, char **texts, dsarl_error *err);

/* 1 when the completion equals the answer once ASCII whitespace is trimmed from both ends of each, else 0. */
int sft_answer_matches(const char *completion, const char *answer);

/* The whole SFT job (the algorithm ops' run). */
int sft_run(const dsarl_run_context *ctx, dsarl_error *err);

#endif /* DSARL_SFT_H */
