"""The wire format: requests and replies, their kinds, arrays, camera frames, checked values
and the one exception -> wire-code map. Pure: no paho, no model, no clock."""
