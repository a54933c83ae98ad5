"""Everything fleet runs on a host: each step's files, the code they share, and the launchers. Sent as
text by fleet.hostscripts (standard library only, Python 3.8); imported as modules by fleet's own tests."""
