"""Helpers shared by the test files, imported as ``helpers.<module>`` (``tests/`` is on
pytest's ``pythonpath``): a real server on a socket (``support``), throwaway
PostgreSQL databases (``pg``), ``troth serve`` child processes (``troth_process``),
the strict SSE reader (``sse``), the real-SDK environments (``sdk_env``), a TCP load
balancer (``lb``), the conformance corpus's exceptions (``conformance_cases``).
"""
