"""Search over reasoning steps: nodes keep their cache (`expand`), strategies expand them.

Strategies (one module each): step_beam_search, dvts, rebase, mcts, astar, particle_filter,
blockwise_cd; `runner.run_search` runs them by name with a budget n (the registry's entries).
"""
