//! ubdirect
