//! qosd scenarios: scenario files, the open-loop load generator and the
//! simulated node. (Filled by the scenarios issue.)
