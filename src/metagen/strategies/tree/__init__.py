"""Search over reasoning steps: an expander grows nodes by steps — locally from their cache
(`expand`) or through a server's completions (`remote_expand`); `expander` picks one for the
backend, and the strategies use only its interface.

Strategies (one module each): step_beam_search, dvts, rebase, mcts, astar, particle_filter,
blockwise_cd. Each takes its backend first: a LanguageModel, or a Generator with LOCAL_CACHE
or STEP_CONTINUATION (`expander.open_expander`). `runner.run_search` runs them by name with a budget n (the registry's entries).
"""
