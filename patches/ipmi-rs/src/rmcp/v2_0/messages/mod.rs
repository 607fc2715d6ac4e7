mod rakp;
pub use rakp::ErrorStatusCode as RakpErrorStatusCode;

mod open_session;
pub use open_session::{OpenSessionRequest, OpenSessionResponse, ParseSessionResponseError};

mod rakp_1;
pub use rakp_1::{RakpMessage1, Username};

mod rakp_2;
pub use rakp_2::{
    ErrorStatusCode as RakpMessage2ErrorStatusCode, ParseError as RakpMessage2ParseError,
    RakpMessage2,
};

mod rakp_3;
pub use rakp_3::{RakpMessage3, RakpMessage3Contents, RakpMessage3ErrorStatusCode};

mod rakp_4;
pub use rakp_4::{
    ErrorStatusCode as RakpMessage4ErrorStatusCode, ParseError as RakpMessage4ParseError,
    RakpMessage4,
};
