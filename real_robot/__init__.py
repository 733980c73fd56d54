"""Sim-to-real deployment bridge (docs/design.md, "Deployment").

- ``real_robot.server``: the policy server (``embodied-serve``), openpi's websocket + msgpack format;
- ``real_robot.client``: the robot client's control loop (``embodied-deploy``): latency modes,
  safety filter (``real_robot.safety``), watchdog, emergency stop, episode recording;
- ``real_robot.robots``: the ``Robot`` contract, ``SimRobot`` (MuJoCo rehearsal), the network robot, the
  Franka, UR and LeRobot adapters and their no-motion ``check`` (docs/guide/robots.md);
- ``real_robot.cameras``: OpenCV and RealSense cameras.
"""
