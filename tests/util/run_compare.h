/* tests/util/run_compare.h — comparing two training runs by what they leave behind: the
 * losses of OUT/metrics.jsonl and the weights of OUT/model.safetensors. */
#ifndef HP_TEST_RUN_COMPARE_H
#define HP_TEST_RUN_COMPARE_H

/* The "loss" of every line of dir/metrics.jsonl, at most max; how many. Asserts when the
 * file is missing or a line has no loss. */
int hp_th_read_losses(const char *dir, double *losses, int max);

/* Expects the runs in dirs a and b to have logged the same number of steps with losses
 * within abs + rel * |a's|, naming `what` and the step on a difference. */
void hp_th_expect_losses_close(const char *a, const char *b, double abs, double rel,
                               const char *what);

/* Expects a/model.safetensors and b/model.safetensors to hold the same tensors (names,
 * shapes) with every element within abs + rel * (the tensor's largest |a| element), naming
 * `what` and the tensor. */
void hp_th_expect_weights_close(const char *a, const char *b, double abs, double rel,
                                const char *what);

#endif
