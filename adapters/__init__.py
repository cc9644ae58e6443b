"""kvfence.adapters: systems under test, as the checker drives them.

``protocol`` (the contract and capability names), ``reference`` (the correct system),
``mutants`` (faulty systems from public bugs), ``cases`` (the public reports as traces),
``clients`` (client resolvers), ``vllm_engine`` (vLLM on CPU), ``registry`` (names).
"""
