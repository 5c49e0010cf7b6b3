//! qosd actuators: apply a resource setting to an app, read back what is in
//! force, and restore what was found. (Filled by the actuators issue.)
