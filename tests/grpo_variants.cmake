# The GRPO variants' own metrics (algorithms/grpo): the KL that Reinforce++'s use_kl_in_reward subtracts.
if(TARGET dsarl-algorithm-grpo-objects)
  dsarl_add_check_test(check_grpo_reward_kl SOURCES check_grpo_reward_kl.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects TIMEOUT 30)
endif()
