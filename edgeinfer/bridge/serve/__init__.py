"""Serving: the paho client (MQTT v5), the worker (bounded queue, deadlines, de-duplication),
generation lanes, replies, settings, per-model statistics and Home Assistant discovery."""
