"""`python -m sglang.launch_server ...` on a simulated host runs the engine simulator."""

from fleet_testbed.sglang_sim import main

if __name__ == "__main__":
    main()
