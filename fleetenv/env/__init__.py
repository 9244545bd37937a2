"""The episode object: reset/step/close, actions, observations, stop reasons, reward."""
