"""The LIBERO-style suites' content on the MuJoCo tabletop: scenes and objects (:mod:`.objects`,
:mod:`.base`), the tasks of each suite (:mod:`.spatial`, :mod:`.object_suite`, :mod:`.goal`,
:mod:`.dynamic`) and their scripted experts (:mod:`.experts`). The registry :mod:`sims.suites` lists
them; nothing here imports it.
"""
