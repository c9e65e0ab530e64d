# Chat templates: the Jinja subset against transformers' renderings, template discovery, refusals and bounds.
dsarl_add_check_test(check_chat_template SOURCES check_chat_template.c LABELS unit LIBS PkgConfig::JANSSON)
