"""Test support shared by tests/, graph_tests/ and bench/: import it as
``tests.support.<module>`` from the repository root (pytest's ``pythonpath``
setting and ``python -m`` from the root both put the root on ``sys.path``)."""
