"""RocketMQ clients written by others, run against mockbroker's RocketMQ fronts.

- provision.py: installs PyPI `rocketmq` 0.4.4 (rocketmq-client-cpp 1.2.3) and
  `rocketmq-python-client` 5.1.2 into virtualenvs of their own, npm `ali-ons` 3.12.0 and
  `rocketmq-client-nodejs` 1.0.8 into node_modules of their own, under ~/.cache/ordermq/interop/
  (`make interop-setup`); tests skip with the reason when a client cannot be installed;
- cpp_driver.py, ons_driver.js (RocketMQ 4 remoting, issue 23), rmq5_driver.py,
  rmq5_driver.js (RocketMQ 5's gRPC API, issue 18): the programs that run those clients,
  one JSON line per event;
- harness.py: driver processes and the brokers, for the tests in tests/system/
  (test_rocketmq_*_client.py, test_rocketmq5_*_client.py) and the bench.
"""
