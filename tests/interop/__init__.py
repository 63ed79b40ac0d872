"""RocketMQ clients written by others, run against mockbroker's remoting front (issue 23).

- provision.py: installs PyPI `rocketmq` 0.4.4 (rocketmq-client-cpp 1.2.3) into its own
  virtualenv and npm `ali-ons` 3.12.0 into its own node_modules, under .cache/interop/
  (`make interop-setup`); tests skip with the reason when a client cannot be installed;
- cpp_driver.py, ons_driver.js: the programs that run those clients, one JSON line per event;
- harness.py: driver processes and the remoting broker, for the tests in tests/system/
  (test_rocketmq_cpp_client.py, test_rocketmq_node_client.py) and the bench.
"""
