# dsarl_key_table_join: the recipe-key table join of the algorithm plugins (order kept, overflow refused).
dsarl_add_check_test(check_key_table SOURCES check_key_table.c LABELS unit TIMEOUT 30)
